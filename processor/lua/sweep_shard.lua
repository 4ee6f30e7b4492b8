--[==[
sweep_shard: what a worker checks on a shard when no entry forces it to:
turns whose closing entry is now below the watermark (their last entries
were applied by a worker that died before finalising, or became ready when
another consumer acked an earlier entry), turns idle past the timeout, and
a slice of the active turns to check for cancellation keys.

KEYS[1] updates stream   KEYS[2] active zset   KEYS[3] closing zset

ARGV[1] consumer group   ARGV[2] turn timeout (ms)
ARGV[3] ready limit      ARGV[4] active slice start   ARGV[5] active slice size

Returns { now_ms, ready closing members, timed-out tks, active slice tks, active count }
]==]

local updates, active, closing = KEYS[1], KEYS[2], KEYS[3]
local group = ARGV[1]
local timeout_ms, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local start, size = tonumber(ARGV[4]), tonumber(ARGV[5])

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

--- includes/pad_id
--- includes/ready_closing

-- A stream or group deleted under a running worker must not fail the sweep.
local ok, ready = pcall(ready_closing, updates, group, closing, limit)
if not ok then ready = {} end
local expired = redis.call('ZRANGEBYSCORE', active, '-inf', now_ms - timeout_ms, 'LIMIT', 0, limit)
local slice = redis.call('ZRANGE', active, start, start + size - 1)
return { now_ms, ready, expired, slice, redis.call('ZCARD', active) }
