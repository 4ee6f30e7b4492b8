-- dead_letter: copy an input entry into the DLQ, whole, with reason,
-- detail, source_id and deliveries appended. The copy is made here, inside
-- Redis: the worker never holds it (an entry a worker cannot or will not
-- read, such as one over --max-entry-bytes, is dead-lettered by its id), and
-- it replaces the stream's copy, which is trimmed once acked. Every field is
-- kept byte for byte, so `processor dlq replay` brings the entry back as the
-- producer wrote it. An entry of more than `fields_max` names and values
-- (more than one XADD from a script can carry: Lua unpacks at most ~8000
-- values) is kept whole too, as one msgpack array of its names and values in
-- the field `packed_fields` (with packed=1), which replay refuses by name.
local function dead_letter(updates, dlq, dlq_max, fields_max, id, reason, detail, deliveries)
  local fields = {}
  local found = redis.call('XRANGE', updates, id, id)
  local packed = false
  if found[1] then
    local orig = found[1][2]
    if #orig > fields_max then
      packed = true
      fields[1] = 'packed_fields'
      fields[2] = cmsgpack.pack(orig)
    else
      fields = orig
    end
  end
  for _, v in ipairs({ 'reason', reason, 'detail', detail, 'source_id', id, 'deliveries', deliveries }) do
    fields[#fields + 1] = v
  end
  if packed then fields[#fields + 1] = 'packed'; fields[#fields + 1] = '1' end
  redis.call('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', unpack(fields))
end
