--[==[
beat_worker: a worker says it is alive (or that it leaves), and learns
which workers of its consumer group are alive, in one step on Redis's clock
(so the workers' own clocks never matter). The live set is what the workers
split the shards by (processor/worker/affinity.py); a worker that stops beating
drops out of it after the TTL, and its shards go to the others.

KEYS[1] the group's workers zset (member: consumer name, score: last beat, ms)

ARGV[1] consumer name   ARGV[2] TTL in ms   ARGV[3] "beat" or "leave"

Returns the live consumer names, in name order, without the leaver.
]==]

local workers = KEYS[1]
local consumer, ttl, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if mode == 'leave' then
  redis.call('ZREM', workers, consumer)
else
  redis.call('ZADD', workers, now, consumer)
end
redis.call('ZREMRANGEBYSCORE', workers, '-inf', '(' .. (now - ttl))
-- Nobody beating for a whole TTL: the key goes, instead of lingering empty.
redis.call('PEXPIRE', workers, ttl * 2)
local live = redis.call('ZRANGE', workers, 0, -1)
table.sort(live)
return live
