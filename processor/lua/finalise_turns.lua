--[==[
finalise_turns: publish the outcome of finished turns and delete their state.

For each turn, atomically: unless it is already done (another worker won) or
its state changed since the caller read it (version check: the caller merges
again), XADD the merged response and the terminal synthesis event (seq = the
turn's next seq, so it is always last), dead-letter the entries the replay
found after the turn's end, mark the turn done (hash with TTL, for dedup and
drop counting) and delete its state.

KEYS[1] merged stream   KEYS[2] events stream   KEYS[3] dlq stream
KEYS[4] active zset     KEYS[5] closing zset
KEYS[5 + 3*(t-1) + 1..3]   per turn t: turn hash, recs hash, done hash

ARGV[1] merged MAXLEN (~)  ARGV[2] events MAXLEN (~)  ARGV[3] dlq MAXLEN (~)
ARGV[4] done TTL (seconds) ARGV[5] number of turns T
ARGV[6 + 5*(t-1) + 0..4]   per turn t: tk, expected version, status,
                           merged fields + terminal event fields (msgpack [[...], [...]]),
                           dead letters (msgpack array of field arrays)

Returns one integer per turn: 1 published, 0 already done or gone, -1 changed
]==]

local merged, events, dlq, active, closing = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local merged_max, events_max, dlq_max = ARGV[1], ARGV[2], ARGV[3]
local done_ttl = ARGV[4]
local nturns = tonumber(ARGV[5])

--- includes/publish_event

local function finalise(t)
  local k, a = 5 + 3 * (t - 1), 6 + 5 * (t - 1)
  local tkey, rkey, dkey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local tk, version, status = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  if redis.call('EXISTS', dkey) == 1 or redis.call('EXISTS', tkey) == 0 then return 0 end
  if (redis.call('HGET', tkey, 'ver') or '0') ~= version then return -1 end
  local out = cmsgpack.unpack(ARGV[a + 3])
  redis.call('XADD', merged, 'MAXLEN', '~', merged_max, '*', unpack(out[1]))
  publish_event(tkey, events, events_max, out[2])
  for _, fields in ipairs(cmsgpack.unpack(ARGV[a + 4])) do
    redis.call('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', unpack(fields))
  end
  redis.call('HSET', dkey, 'status', status, 'dropped', 0)
  redis.call('EXPIRE', dkey, done_ttl)
  local member = redis.call('HGET', tkey, 'closing')
  if member then redis.call('ZREM', closing, member) end
  redis.call('ZREM', active, tk)
  redis.call('DEL', tkey, rkey)
  return 1
end

local results = {}
for t = 1, nturns do results[t] = finalise(t) end
return results
