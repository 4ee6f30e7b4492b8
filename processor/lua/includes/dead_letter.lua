-- dead_letter: copy an input entry's fields into the DLQ (each value cut to
-- a bounded prefix, at most 1000 fields: one XADD cannot take more arguments
-- than Lua can unpack), with reason, detail, source_id and deliveries.
local function dead_letter(updates, dlq, dlq_max, value_max, id, reason, detail, deliveries)
  local fields = {}
  local found = redis.call('XRANGE', updates, id, id)
  local truncated = false
  if found[1] then
    local orig = found[1][2]
    local last = #orig
    if last > 2000 then last = 2000; truncated = true end
    for j = 1, last, 2 do
      local v = orig[j + 1]
      if #v > value_max then v = string.sub(v, 1, value_max); truncated = true end
      fields[#fields + 1] = orig[j]
      fields[#fields + 1] = v
    end
  end
  for _, v in ipairs({ 'reason', reason, 'detail', detail, 'source_id', id, 'deliveries', deliveries }) do
    fields[#fields + 1] = v
  end
  if truncated then fields[#fields + 1] = 'truncated'; fields[#fields + 1] = '1' end
  redis.call('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', unpack(fields))
end
