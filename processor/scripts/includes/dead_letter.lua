-- dead_letter: copy an input entry's fields into the DLQ, with reason,
-- detail, source_id and deliveries. The copy is bounded whatever the entry
-- (a malicious producer must not make the DLQ echo its payload): at most
-- `budget` bytes of names and values in all. An entry that fits is copied
-- as it is; a bigger one keeps its small fields first (the ids that say
-- whose entry it was), then prefixes of the others, names cut to 256 bytes,
-- while the budget lasts. At most 1000 fields are looked at (one XADD cannot
-- take more arguments than Lua can unpack). A cut copy has truncated=1.
local function dead_letter(updates, dlq, dlq_max, budget, id, reason, detail, deliveries)
  local fields = {}
  local found = redis.call('XRANGE', updates, id, id)
  local truncated = false
  if found[1] then
    local orig = found[1][2]
    local last = #orig
    if last > 2000 then last = 2000; truncated = true end
    local total = 0
    for j = 1, last do total = total + #orig[j] end
    if total <= budget then
      for j = 1, last do fields[j] = orig[j] end
    else
      truncated = true
      local left, small = budget, {}
      for j = 1, last, 2 do
        local size = #orig[j] + #orig[j + 1]
        if size <= 1024 and size <= left then
          fields[#fields + 1] = orig[j]
          fields[#fields + 1] = orig[j + 1]
          left = left - size
          small[j] = true
        end
      end
      for j = 1, last, 2 do
        if left <= 0 then break end
        if not small[j] then
          local name = string.sub(orig[j], 1, math.min(256, left))
          local value = string.sub(orig[j + 1], 1, left - #name)
          left = left - #name - #value
          fields[#fields + 1] = name
          fields[#fields + 1] = value
        end
      end
    end
  end
  for _, v in ipairs({ 'reason', reason, 'detail', detail, 'source_id', id, 'deliveries', deliveries }) do
    fields[#fields + 1] = v
  end
  if truncated then fields[#fields + 1] = 'truncated'; fields[#fields + 1] = '1' end
  redis.call('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', unpack(fields))
end
