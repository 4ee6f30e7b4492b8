--[==[
publish_lost_turns: publish the turns a worker knows were in flight when
the namespace's state in Redis was lost (a Redis restarted without
persistence: the record's epoch changed or the record vanished), from its
own memory: the turns it held, and those it had a mirror of (mirror.py). Each
is published as error state_lost with its partial merge, never as
completed, exactly once (done marker), as finalise_turns publishes.

For each turn, atomically, unless it is done already (0): XACK the ids the
worker held of it (entries read after the loss are pending in the group
recreated since), publish its outcome (merged entry, terminal event with
the turn's next seq, AG-UI entries with --agui, the dead letters its replay
found), mark it done and delete whatever state of it exists now (records
of entries applied since the loss are in its merge: the worker fed them to
its copy first), and take it out of `active` and `closing`.

KEYS[1] merged stream   KEYS[2] events stream   KEYS[3] dlq stream
KEYS[4] active zset     KEYS[5] closing zset    KEYS[6] updates stream
KEYS[6 + 4*(t-1) + 1..4]   per turn t: turn hash, recs hash, done hash, live log
KEYS[6 + 4*T + 1]          agui stream (only with --agui)

ARGV[1] merged MAXLEN (~)  ARGV[2] events MAXLEN (~)  ARGV[3] dlq MAXLEN (~)
ARGV[4] done TTL (seconds) ARGV[5] number of turns T  ARGV[6] consumer group
ARGV[7]                    the turns: one msgpack array, per turn t an array
                           { tk, status, outputs, dead letters (as
                           finalise_turns), the held entry ids (an array) }

Returns one integer per turn: 1 published, 0 already done
]==]

local merged, events, dlq, active, closing = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local updates = KEYS[6]
local merged_max, events_max, dlq_max = ARGV[1], ARGV[2], ARGV[3]
local done_ttl = ARGV[4]
local nturns = tonumber(ARGV[5])
local group = ARGV[6]
local agui = KEYS[6 + 4 * nturns + 1]

--- includes/publish_event
--- includes/publish_outcome
--- includes/trim_acked

local turns = cmsgpack.unpack(ARGV[7])
local results = {}
local acked = false
for t = 1, nturns do
  local k = 6 + 4 * (t - 1)
  local tkey, rkey, dkey, lkey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local tk, status, outputs, dead, ids = unpack(turns[t], 1, 5)
  if redis.call('EXISTS', dkey) == 1 then
    results[t] = 0
  else
    for j = 1, #ids, 1000 do  -- (a missing group answers an error: nothing to ack then)
      redis.pcall('XACK', updates, group, unpack(ids, j, math.min(j + 999, #ids)))
      acked = true
    end
    local member = redis.call('HGET', tkey, 'closing')
    if member then redis.call('ZREM', closing, member) end
    redis.call('DEL', rkey)
    -- The terminal event comes after synthesis.started (seq 0) even when the
    -- turn's hash went with the rest of the state.
    redis.call('HSETNX', tkey, 'seq', '1')
    publish_outcome(tkey, dkey, lkey, tk, status, outputs, dead)
    results[t] = 1
  end
end
if acked then pcall(trim_acked, updates, group) end
return results
