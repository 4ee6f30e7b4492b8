--[==[
create_namespace: write a namespace's record once, or return the one stored.

The record holds what every party of a namespace must agree on: its number
of shards (where producers write and what workers read), its consumer group
and an epoch (a random id written at creation: a worker that finds another
epoch, or no record, knows the namespace's state in Redis is gone). Written
by `processor init` or by the first worker, read by every worker, tool and
client (processor/scripts/meta.py). Create-if-absent in one step, so two workers
starting at once with different settings agree on one record.

KEYS[1] the namespace's record ({ns:0}:meta)

ARGV[1] shards   ARGV[2] consumer group   ARGV[3] epoch (a new random id)

Returns the record as stored, flat [name, value, ...]
]==]

local meta = KEYS[1]
if redis.call('EXISTS', meta) == 0 then
  local t = redis.call('TIME')
  local now = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call('HSET', meta, 'format', '1', 'shards', ARGV[1], 'group', ARGV[2],
             'epoch', ARGV[3], 'created', now)
end
return redis.call('HGETALL', meta)
