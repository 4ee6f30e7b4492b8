--[==[
publish_live: one batch's live progress of some turns (processor.live): their
events on the shard's events stream, and one entry of each turn's live log,
which processor serve reads to join or resume a running turn (docs/serve.md,
"Joining and resuming").

For each turn, atomically, unless it ended (its done marker exists) or has
no hash (published or forgotten meanwhile) (-1), or the caller starts
speaking for it afresh while its log exists (-2: another worker spoke for
it, then died or let go; what it said is unknown here, so this one stays
silent and the turn's merged event ends any view): number its events with the
turn's next seqs and XADD each to the events stream (includes/publish_event:
gap-free with everything else the turn publishes), then, if it has events
or updates, XADD one entry to its log: `seq` the turn's last seq now,
`events` the numbered events' JSON as one array, `updates` the JSON array of
the updates this batch merged into the turn (the log folded with the merge
is the turn's merge at `seq`); and give the log its TTL (--done-ttl plus
--turn-timeout, renewed at each entry: it outlives the turn by about
--done-ttl, as the done marker does).

KEYS[1]                    events stream
KEYS[1 + 3*(t-1) + 1..3]   per turn t: turn hash, done hash, live log

ARGV[1] events MAXLEN (~)  ARGV[2] log TTL (seconds)  ARGV[3] number of turns T
ARGV[4]                    the turns: one msgpack array, per turn t an array
                           { events (an array of event field arrays, each
                           JSON with "seq":0), updates (JSON array text),
                           fresh ('1': the caller's first publish of it) }

Returns one integer per turn: the number of events published, -1 when
the turn ended or has no hash, -2 when it was fresh and has a log.
]==]

local events = KEYS[1]
local events_max, ttl = ARGV[1], ARGV[2]
local nturns = tonumber(ARGV[3])

--- includes/publish_event

local turns = cmsgpack.unpack(ARGV[4])
local results = {}
for t = 1, nturns do
  local k = 1 + 3 * (t - 1)
  local tkey, dkey, log = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local found, updates, fresh = turns[t][1], turns[t][2], turns[t][3]
  if redis.call('EXISTS', dkey) == 1 or redis.call('EXISTS', tkey) == 0 then
    results[t] = -1
  elseif fresh == '1' and redis.call('EXISTS', log) == 1 then
    results[t] = -2
  else
    local jsons = {}
    for i, fields in ipairs(found) do
      publish_event(tkey, events, events_max, fields)
      jsons[i] = fields[#fields]
    end
    if #jsons > 0 or updates ~= '[]' then
      local seq = tonumber(redis.call('HGET', tkey, 'seq') or '1') - 1
      redis.call('XADD', log, '*', 'seq', seq, 'events', '[' .. table.concat(jsons, ',') .. ']',
                 'updates', updates)
      redis.call('EXPIRE', log, ttl)
    end
    results[t] = #jsons
  end
end
return results
