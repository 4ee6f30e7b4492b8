--[==[
reshard_namespace: change the number of shards of a drained namespace
(`processor init --shards N --reshard`, which checks first that every shard
is drained and no worker is live: docs/cluster.md, *Changing the number of
shards*). Compare-and-set: the record changes only if it is still the one
the caller checked, so two reshards never both win. The epoch stays: the
namespace's state is not lost, and a worker still running sees the shard
count change and stops.

KEYS[1] the namespace's record ({ns:0}:meta)

ARGV[1] epoch the caller read   ARGV[2] shards the caller read
ARGV[3] the new number of shards

Returns 1 changed, 0 the record changed meanwhile (or is gone)
]==]

local meta = KEYS[1]
local now = redis.call('HMGET', meta, 'epoch', 'shards')
if now[1] ~= ARGV[1] or now[2] ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
redis.call('HSET', meta, 'shards', ARGV[3], 'resharded',
           tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
return 1
