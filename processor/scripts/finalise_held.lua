--[==[
finalise_held: publish held turns (the default) and ack their entries,
which were pending to this consumer until now (docs/design.md, "Held turns").

For each turn, atomically, unless it is done or gone (0), or its version
moved since open_turns made it (-1: some consumer stored, dropped or
dead-lettered one of its entries, so this worker's copy is not the whole
turn), or another consumer has a pending entry older than the entry that
ended it or, for a cancel, older than what this consumer has routed (2:
that entry may be one of the turn's; not checked for a timeout, after which
such entries are dead-lettered turn_closed), or, for a turn its end (or
error, or a limit) closed, its cancel key exists (3: a cancel the end was
taken in after wins, as on the stored path; the cut is the end):
XACK every entry of the turn this consumer holds (one call), then publish
its outcome as finalise_turns does (merged response, terminal event, dead
letters, done marker) and trim what is acked from the stream. The entries
the worker found after the turn's end are dead-lettered from the stream's
copy, with their original fields, as apply_entries dead-letters them (held
entries are pending, so the stream still has them). The turn's last live
progress events (those of the batch that ended it, publish_live.lua's for
the other turns) go first, numbered before its terminal event, if its
`live` mark is this speaker's with the count given (or absent, with count
0 and no live log: nothing was said of the turn yet); else another worker
spoke for the turn and they are left out (its merged event ends any view).
They need no live log entry nor a new mark: the turn's log and hash are
deleted in this same step. Published with the outcome, they are published
once, as the outcome is. The caller
spills a turn that got anything but 1 (apply_entries stores and acks its
entries, and the turn finalises through finalise_turns).

Why the XACK cannot miss an entry: every entry of the turn is older than
its ending one, so (XREADGROUP delivers in id order) each was delivered
and is acked or pending. Acked means applied (version moved) or published
(done), or checkpointed (checkpoint_held.lua: in the snapshot, version
moved to the one given); pending to another consumer fails the check above;
so all are pending to this consumer, and it holds every one of those (a
worker takes back its own pending entries when it starts).

KEYS[1] merged stream   KEYS[2] events stream   KEYS[3] dlq stream
KEYS[4] active zset     KEYS[5] updates stream
KEYS[5 + 5*(t-1) + 1..5]   per turn t: turn hash, done hash, live log, cancel key, recs hash
KEYS[5 + 5*T + 1]          agui stream (only with --agui)

ARGV[1] merged MAXLEN (~)  ARGV[2] events MAXLEN (~)  ARGV[3] dlq MAXLEN (~)
ARGV[4] done TTL (seconds) ARGV[5] number of turns T  ARGV[6] consumer group
ARGV[7] this consumer      ARGV[8] most names and values of an entry its DLQ entry keeps as fields
ARGV[9]                    the turns: one msgpack array (the client packs each
                           ARGV in Python, the array in C), per turn t an array
                           { tk, expected version (0, or its last checkpoint's),
                           status, outputs, dead letters
                           (as finalise_turns), the held entry ids (an array),
                           the id of the entry that ended the turn ('' = a
                           cancel or a timeout: published with what is held, as
                           finalise_turns publishes what is stored, without the
                           check on other consumers), the late entries (an
                           array of { id, reason, detail }: dead-lettered),
                           for a cancel the newest entry id this consumer
                           has routed (every entry pending to it up to there
                           is held; '' = unknown), the live events (an array,
                           three values per event, as includes/xadd_events
                           takes them), the speaker's count of publish_live
                           calls for the turn that ran, and the turn's
                           response, synthesis and attempt ('' none) ids }
ARGV[10]                   the speaker (this worker's, as publish_live.lua's)

Returns one integer per turn: 1 published, 0 already done or gone, -1
changed, 2 another consumer holds an older entry, 3 cancelled before its
end was published (its cut recorded at the end: the caller spills it, and
the stored path publishes it cancelled without its end)
]==]

local merged, events, dlq, active, updates = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local merged_max, events_max, dlq_max = ARGV[1], ARGV[2], ARGV[3]
local done_ttl = ARGV[4]
local nturns = tonumber(ARGV[5])
local group, consumer = ARGV[6], ARGV[7]
local dlq_fields_max = tonumber(ARGV[8])
local speaker = ARGV[10] .. ' '
local agui = KEYS[5 + 5 * nturns + 1]

--- includes/dead_letter
--- includes/pad_id
--- includes/publish_event
--- includes/publish_events
--- includes/publish_outcome
--- includes/last_delivered
--- includes/trim_acked
--- includes/watermark
--- includes/require_group

require_group(updates, group)

-- The oldest entry pending to another consumer, looked up once, on the
-- first turn that needs it (false: none is).
local others_first = others_oldest_once(updates, group, consumer)

local turns = cmsgpack.unpack(ARGV[9])
local acked = false
local function finalise(t)
  local k = 5 + 5 * (t - 1)
  local tkey, dkey, lkey, ckey, rkey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]
  local tk, version, status, outputs, dead, ids, ending, late, routed, found, n, rid, sid,
    attempt = unpack(turns[t], 1, 14)
  if redis.call('EXISTS', dkey) == 1 or redis.call('EXISTS', tkey) == 0 then return 0 end
  if ending ~= '' and redis.call('EXISTS', ckey) == 1 then
    -- Cancelled before its end was published: this call is the first to
    -- meet the key after the end was taken in (the held path reads no key
    -- when it routes a batch), as apply_entries meets it applying the end's
    -- batch. The cut is the end (includes/cancel_cut: what this worker
    -- routed before it, shown live already, is merged; the end and after
    -- are dropped), unless a script cut the turn already; the stored path
    -- publishes it cancelled from there (3: the caller spills it).
    if not redis.call('HGET', tkey, 'cut') then
      redis.call('HSET', tkey, 'cut', pad_id(ending))
    end
    return 3
  end
  if (redis.call('HGET', tkey, 'ver') or '0') ~= version then return -1 end
  if ending ~= '' then
    local oldest = others_first()
    if oldest and oldest < pad_id(ending) then return 2 end
  elseif status == 'cancelled' then
    -- The cut (includes/cancel_cut in the stored path) is what this consumer
    -- has routed: it holds every entry of the turn up to there, unless
    -- another consumer has one pending (a worker that read it and died) or
    -- another script cut the turn elsewhere; then the stored path cuts it.
    if routed == '' then return -1 end
    local bound = pad_id(routed) .. '+'
    local cut = redis.call('HGET', tkey, 'cut')
    if cut and cut ~= bound then return -1 end
    local oldest = others_first()
    if oldest and oldest < bound then return 2 end
  end
  for j = 1, #ids, 1000 do
    redis.call('XACK', updates, group, unpack(ids, j, math.min(j + 999, #ids)))
  end
  acked = true
  for _, one in ipairs(late) do
    dead_letter(updates, dlq, dlq_max, dlq_fields_max, one[1], one[2], one[3], '1')
  end
  if #found > 0 then
    local mark = redis.call('HGET', tkey, 'live')
    if mark == speaker .. n or (mark == false and n == 0 and redis.call('EXISTS', lkey) == 0) then
      publish_events(tkey, events, rid, sid, attempt, found)  -- (capped by the outcome's XADD)
    end
  end
  publish_outcome(tkey, dkey, lkey, tk, status, outputs, dead)
  redis.call('DEL', rkey)  -- (a checkpoint's snapshot, checkpoint_held.lua)
  return 1
end

local results = {}
for t = 1, nturns do results[t] = finalise(t) end
if acked then trim_acked(updates, group) end
return results
