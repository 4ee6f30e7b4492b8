--[==[
sweep_shard: what a worker checks on a shard when no entry forces it to:
turns whose closing entry is now below the watermark (their last entries
were applied by a worker that died before finalising, or became ready when
another consumer acked an earlier entry), turns idle past the timeout, and
a slice of the active turns to check for cancellation keys.

KEYS[1] updates stream   KEYS[2] active zset   KEYS[3] closing zset

ARGV[1] consumer group   ARGV[2] turn timeout (ms)
ARGV[3] ready limit (most closing and timed-out turns returned; 0 for
        none: a worker sweeping a shard it does not read, for cancels only)
ARGV[4] active slice start   ARGV[5] active slice size
ARGV[6] this consumer        ARGV[7] its floor (includes/watermark; '' = none)

Returns { now_ms, ready closing members, timed-out tks, active slice tks, active count }
]==]

local updates, active, closing = KEYS[1], KEYS[2], KEYS[3]
local group = ARGV[1]
local timeout_ms, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local start, size = tonumber(ARGV[4]), tonumber(ARGV[5])
local consumer, floor = ARGV[6], ARGV[7]

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

--- includes/pad_id
--- includes/watermark
--- includes/ready_closing

-- Nothing to read without a limit (a sweep for cancels only) or a closing
-- turn (an idle shard): then the watermark is not read either.
local ready, expired = {}, {}
if limit > 0 and redis.call('EXISTS', closing) == 1 then
  -- A stream or group deleted under a running worker must not fail the sweep.
  local ok, found = pcall(ready_closing, updates, group, consumer, floor, closing, limit)
  if ok then ready = found end
end
-- Idle means no entry *arrived* for the timeout (docs/contract.md §7), not "none was
-- applied": entries may wait in a dead worker's pending list or, after an
-- outage, unread. Applied entries are deleted, so the stream's first entry is
-- the oldest unapplied one; a turn last active at `a` is idle only if every
-- entry that arrived before a + timeout is applied (first entry later).
if limit > 0 then
  local horizon = now_ms
  local first = redis.call('XRANGE', updates, '-', '+', 'COUNT', 1)
  if first[1] then
    local arrived = tonumber(string.match(first[1][1], '^(%d+)'))
    if arrived - 1 < horizon then horizon = arrived - 1 end
  end
  expired = redis.call('ZRANGEBYSCORE', active, '-inf', horizon - timeout_ms, 'LIMIT', 0, limit)
end
local slice = redis.call('ZRANGE', active, start, start + size - 1)
return { now_ms, ready, expired, slice, redis.call('ZCARD', active) }
