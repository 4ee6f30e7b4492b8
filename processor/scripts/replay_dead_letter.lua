--[==[
replay_dead_letter: put a dead-lettered entry back on its input stream and
remove it from the DLQ, in one step (never both copies, never neither).

Without fields the entry's original fields are added back: the DLQ entry
minus what the worker appended (reason, detail, source_id, deliveries and an
optional trailing packed=1 or truncated=1). A packed entry (more fields than
one XADD from a script can carry, kept whole as one msgpack array in
`packed_fields`) is refused, and so is a truncated one (written by a worker
that cut big entries, before dead letters were kept whole): those can only
be replayed with fixed fields.

KEYS[1] dlq stream   KEYS[2] updates stream (same shard: same hash tag)

ARGV[1] the DLQ entry id
ARGV[2..] optional: the field/value pairs to add instead of the original ones

Returns the new entry id on the updates stream. Errors: NODEADLETTER (no
such DLQ entry), NOTDEADLETTER (not in the DLQ's shape), TRUNCATED, PACKED.
]==]

local dlq, updates, id = KEYS[1], KEYS[2], ARGV[1]
local found = redis.call('XRANGE', dlq, id, id)
if not found[1] then
  return redis.error_reply('NODEADLETTER no entry ' .. id .. ' in ' .. dlq)
end

local fields = {}
if #ARGV > 1 then
  for i = 2, #ARGV do fields[i - 1] = ARGV[i] end
else
  local f = found[1][2]
  local n = #f
  local truncated = n >= 2 and f[n - 1] == 'truncated'
  local packed = n >= 2 and f[n - 1] == 'packed'
  if truncated or packed then n = n - 2 end
  if n < 8 or f[n - 7] ~= 'reason' or f[n - 5] ~= 'detail' or f[n - 3] ~= 'source_id'
      or f[n - 1] ~= 'deliveries' then
    return redis.error_reply('NOTDEADLETTER entry ' .. id .. ' lacks the fields a worker adds')
  end
  if truncated then
    return redis.error_reply('TRUNCATED entry ' .. id .. ' was cut when dead-lettered')
  end
  if packed then
    return redis.error_reply('PACKED entry ' .. id .. ' has more fields than a script can '
      .. 'add: its names and values are the msgpack array in packed_fields')
  end
  for i = 1, n - 8 do fields[i] = f[i] end
end
if #fields == 0 then
  return redis.error_reply('NOTDEADLETTER entry ' .. id .. ' has no original fields')
end

local new_id = redis.call('XADD', updates, '*', unpack(fields))
redis.call('XDEL', dlq, id)
return new_id
