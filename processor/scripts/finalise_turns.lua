--[==[
finalise_turns: publish the outcome of finished turns and delete their state.

For each turn, atomically: unless it is already done (another worker won) or
its state changed since the caller read it (version check: the caller merges
again), XADD the merged response and the terminal synthesis event (seq = the
turn's next seq, so it is always last), dead-letter the entries the replay
found after the turn's end, mark the turn done (hash with TTL, for dedup and
drop counting) and delete its state.

A turn ended by one of its entries (end, error, limit) is published only once
that entry is below the shard's watermark (includes/watermark: every earlier
entry of the stream it may need acked, so the caller's replay had all of them): until then its closing member
is moved to that entry, for a later sweep, and the turn is left alone. The
apply script counts limits in apply order, which may cross a limit "early".

KEYS[1] merged stream   KEYS[2] events stream   KEYS[3] dlq stream
KEYS[4] active zset     KEYS[5] closing zset    KEYS[6] updates stream
KEYS[6 + 4*(t-1) + 1..4]   per turn t: turn hash, recs hash, done hash, live log
KEYS[6 + 4*T + 1]          agui stream (only with --agui: then every turn's outputs carry its run)

ARGV[1] merged MAXLEN (~)  ARGV[2] events MAXLEN (~)  ARGV[3] dlq MAXLEN (~)
ARGV[4] done TTL (seconds) ARGV[5] number of turns T  ARGV[6] consumer group
ARGV[7] this consumer      ARGV[8] its floor (includes/watermark; '' = none)
ARGV[9] the first entry id of the read this consumer has read ahead of its
        applier ('' none): for a cancel's cut (includes/cancel_cut)
ARGV[10 + 6*(t-1) + 0..5]  per turn t: tk, expected version, status,
                           merged fields + terminal event fields (+ AG-UI entries with
                           --agui) (msgpack [[...], [...](, [[...], ...])]),
                           dead letters (msgpack array of field arrays),
                           id of the entry that ended the turn ("" = cancel or timeout)

A cancelled turn (status cancelled, no ending entry) is published only once
every entry up to its cut (includes/cancel_cut) is applied, and never while
another live consumer holds it (its hash's `holder`, set by open_turns, with
entries still pending to that consumer): "not yet" (2), for a later sweep.

Returns one integer per turn: 1 published, 0 already done or gone, -1 changed,
2 not yet (an entry before the one that ended it, or before a cancel's cut,
is still pending, or another worker holds the turn)
]==]

local merged, events, dlq, active, closing = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local updates = KEYS[6]
local merged_max, events_max, dlq_max = ARGV[1], ARGV[2], ARGV[3]
local done_ttl = ARGV[4]
local nturns = tonumber(ARGV[5])
local group, consumer, floor, ahead = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local agui = KEYS[6 + 4 * nturns + 1]

--- includes/pad_id
--- includes/publish_event
--- includes/publish_outcome
--- includes/watermark
--- includes/last_delivered
--- includes/cancel_cut
--- includes/pending_to

-- The shard's watermark (includes/watermark); nil when nothing is pending
-- or the stream or group is gone.
local ok, mark = pcall(watermark, updates, group, consumer, floor)
if not ok then mark = nil end

local function finalise(t)
  local k, a = 6 + 4 * (t - 1), 10 + 6 * (t - 1)
  local tkey, rkey, dkey, lkey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local tk, version, status = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local ending = ARGV[a + 5]
  if redis.call('EXISTS', dkey) == 1 or redis.call('EXISTS', tkey) == 0 then return 0 end
  if (redis.call('HGET', tkey, 'ver') or '0') ~= version then return -1 end
  if ending ~= '' and mark and mark < pad_id(ending) then
    local member = pad_id(ending) .. '|' .. tk
    local current = redis.call('HGET', tkey, 'closing')
    if current ~= member then
      if current then redis.call('ZREM', closing, current) end
      redis.call('ZADD', closing, '0', member)
      redis.call('HSET', tkey, 'closing', member)
    end
    return 2
  end
  if status == 'cancelled' and ending == '' then
    -- A turn another live worker holds (open_turns) is left to it: it
    -- publishes it with what it holds, or stores that first (a spill).
    local holder = redis.call('HGET', tkey, 'holder')
    if holder and holder ~= consumer and pending_to(updates, group, holder) then return 2 end
    -- Published once every entry up to the cut is applied (stored or
    -- dropped), so the partial merge is the turn up to its cut: no entry
    -- older than one it holds is missing.
    local cut = cancel_cut(tkey, rkey, updates, group, true, ahead)
    if mark and mark < cut then return 2 end
  end
  local member = redis.call('HGET', tkey, 'closing')
  if member then redis.call('ZREM', closing, member) end
  redis.call('DEL', rkey)
  publish_outcome(tkey, dkey, lkey, tk, status, ARGV[a + 3], ARGV[a + 4])
  return 1
end

local results = {}
for t = 1, nturns do results[t] = finalise(t) end
return results
