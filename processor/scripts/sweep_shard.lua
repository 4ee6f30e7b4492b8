--[==[
sweep_shard: what a worker checks on a shard when no entry forces it to:
turns whose closing entry is now below the watermark (their last entries
were applied by a worker that died before finalising, or became ready when
another consumer acked an earlier entry), turns idle past the timeout, and
which of a slice of the active turns are cancelled (includes/cancel_check).

KEYS[1] updates stream   KEYS[2] active zset   KEYS[3] closing zset
Keys it names itself: the slice's cancellation keys and turn hashes,
`<ARGV[8]>:cancel:<response id>` and `<ARGV[8]>:turn:<member>` (as
processor.wire.keys's Shard.cancel and Shard.turn name them), all in the
hash slot of KEYS (ARGV[8] is the shard's tag), as BullMQ's scripts name a
job's keys from their queue's prefix: declared, they would be two KEYS
per active turn on every sweep, which at 1,000 open turns would cost the
worker more to build and send than anything but its live progress.

ARGV[1] consumer group   ARGV[2] turn timeout (ms)
ARGV[3] ready limit (most closing and timed-out turns returned; 0 for
        none: a worker sweeping a shard it does not read, for cancels only)
ARGV[4] active slice start   ARGV[5] active slice size
ARGV[6] this consumer        ARGV[7] its floor (includes/watermark; '' = none)
ARGV[8] the shard's key tag (`{<namespace>:<shard>}`)

Returns { now_ms, ready closing members, timed-out tks, the slice's cancelled
tks to finalise now, the slice's length, active count }
]==]

local updates, active, closing = KEYS[1], KEYS[2], KEYS[3]
local group = ARGV[1]
local timeout_ms, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local start, size = tonumber(ARGV[4]), tonumber(ARGV[5])
local consumer, floor, tag = ARGV[6], ARGV[7], ARGV[8]

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

--- includes/pad_id
--- includes/watermark
--- includes/ready_closing
--- includes/cancel_check

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
-- A member is "<length of the response id>:<response id>:<attempt id>"
-- (processor.wire.ids.TurnKey.encode), the length in characters: bytes of
-- UTF-8 here.
local function cancel_key(t)
  local length, rest = string.match(slice[t], '^(%d+):(.*)$')
  local n = tonumber(length)
  if string.find(rest, '[\128-\255]') then
    local i = 1
    for _ = 1, n do
      local c = string.byte(rest, i) or 0
      i = i + (c < 0xC0 and 1 or c < 0xE0 and 2 or c < 0xF0 and 3 or 4)
    end
    n = i - 1
  end
  return tag .. ':cancel:' .. string.sub(rest, 1, n)
end
local function turn_key(t) return tag .. ':turn:' .. slice[t] end
local now, _waiting = cancel_check(#slice, cancel_key, turn_key, updates, group, consumer, floor)
local cancelled = {}
for i, t in ipairs(now) do cancelled[i] = slice[t] end
return { now_ms, ready, expired, cancelled, #slice, redis.call('ZCARD', active) }
