--[==[
publish_live: one batch's live progress of some turns (processor.live): their
events on the shard's events stream, and one entry of each turn's live log,
which processor serve reads to join or resume a running turn (docs/serve.md,
"Joining and resuming").

Exactly once, per turn, whatever happens to the reply: the turn hash's `live`
field is "<speaker> <n>", the worker (speaker: random per worker process) that
speaks for the turn and how many of its calls for the turn ran. A call carries
the speaker and its own n (how many calls for the turn this speaker made
before it, each known to have run); it runs only when `live` is exactly
"<speaker> <n>" (or absent, n = 0 and no live log: the turn's first call) and
then sets it to "<speaker> <n+1>". So a call whose reply was lost is sent
again, unchanged, and answers -3 ("this very call ran"): the caller commits
what it said, and nothing is said twice.

For each turn, atomically, unless it ended (its done marker exists) or has
no hash (published or forgotten meanwhile) (-1), or `live` is
"<speaker> <n+1>" (-3: this call ran before), or `live` names another speaker
or another count, or is absent for n > 0, or is absent for n = 0 while the
turn's log exists (-2: another worker spoke for the turn, then died or let
go, or what this one said is no longer there (lost state); what was said is
unknown here, so this one stays silent and the turn's merged event ends any
view): number its events with the turn's next seqs and XADD each to the
events stream (gap-free with everything else the turn publishes; the stream
capped once per call), advance `live` and `seq` in one HSET, then, if it has
events or updates, XADD one entry to its log: `seq` the turn's last seq now,
`events` the numbered events' JSON as one array, `updates` the JSON array of
the updates merged into the turn since its last log entry (the log folded
with the merge is the turn's merge at `seq`); and, when the caller asks
(its first log entry from this worker, then about once a minute), give the
log its TTL (--done-ttl plus --turn-timeout: it outlives an abandoned turn;
a published turn's log is deleted with its hash).

KEYS[1]                    events stream
Keys it names itself, per turn: its hash, done hash and live log,
`<ARGV[4]>:turn:<tk>`, `<ARGV[4]>:done:<tk>` and `<ARGV[4]>:live:<tk>` (as
processor.wire.keys's Shard.turn, Shard.done and Shard.live name them), all
in the hash slot of KEYS[1] (ARGV[4] is the shard's tag), as sweep_shard
names its slice's keys: declared, they would be three KEYS per turn per
call, the largest part of its packing when a batch moves many turns.

ARGV[1] events MAXLEN (~)  ARGV[2] log TTL (seconds)  ARGV[3] number of turns T
ARGV[4] the shard's key tag (`{<namespace>:<shard>}`)
ARGV[5] the turns: one flat msgpack array (one Lua table to make, not one
        per turn), per turn t in turn, 9 + 3 * count values: tk
        (TurnKey.encode), its `live` token before this call ('' for the
        speaker's first call for it, else "<speaker> <n>"), the token after
        it ("<speaker> <n+1>"), renew (1: EXPIRE the log), updates (JSON
        array text), response_id, synthesis_id, attempt_id ('' none), the
        number of its events (count), then its events, three values each
        (includes/xadd_events)

Returns one integer per turn: the number of events published, -1 when
the turn ended or has no hash, -2 when another speaks (or spoke) for it,
-3 when this very call ran before.
]==]

local events = KEYS[1]
local events_max, ttl = ARGV[1], ARGV[2]
local nturns = tonumber(ARGV[3])
local tag = ARGV[4]

--- includes/xadd_events

local results, published = {}, 0
local turns = cmsgpack.unpack(ARGV[5])
local at = 0  -- (where the turn's values begin in turns, less one)
for t = 1, nturns do
  local tk, before, after = turns[at + 1], turns[at + 2], turns[at + 3]
  local count = turns[at + 9]
  local tkey, log = tag .. ':turn:' .. tk, tag .. ':live:' .. tk
  -- (A hash with a `live` mark is a turn not published yet: the publish
  -- deletes the hash with the done marker's creation, in one step.)
  local got = redis.call('HMGET', tkey, 'live', 'seq')
  local mark = got[1]
  if mark == false and (redis.call('EXISTS', tag .. ':done:' .. tk) == 1
                        or redis.call('EXISTS', tkey) == 0) then
    results[t] = -1
  elseif mark == after then
    results[t] = -3
  elseif (mark == false and (before ~= '' or redis.call('EXISTS', log) == 1))
      or (mark ~= false and mark ~= before) then
    results[t] = -2
  else
    -- The events numbered from the turn's next seq (read above, advanced below).
    local first = got[2] or '0'
    local seq = tonumber(first)
    local updates = turns[at + 5]
    local texts, last = xadd_events(events, turns[at + 6], turns[at + 7], turns[at + 8], turns,
                                    at + 10, count, seq, first)
    if count > 0 then
      redis.call('HSET', tkey, 'live', after, 'seq', string.format('%d', seq + count))
      published = published + count
    else
      redis.call('HSET', tkey, 'live', after)
    end
    if count > 0 or updates ~= '[]' then
      if count == 0 then last = string.format('%d', tonumber(got[2] or '1') - 1) end
      redis.call('XADD', log, '*', 'seq', last, 'events', table.concat(texts),  -- (one string)
                 'updates', updates)
      if turns[at + 4] == 1 then redis.call('EXPIRE', log, ttl) end
    end
    results[t] = count
  end
  at = at + 9 + 3 * count
end
-- The events stream's cap, once per call (as an XADD MAXLEN ~ would keep it).
if published > 0 then redis.call('XTRIM', events, 'MAXLEN', '~', events_max) end
return results
