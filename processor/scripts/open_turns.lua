--[==[
open_turns: start holding turns whose first entries this worker read
(--hold-turns; docs/design.md, "Held turns").

For each turn, atomically: a turn that is done, has a hash already (some
consumer started it: its entries take the apply_entries path) or is
cancelled is left as it is ("old"). Any other turn gets its hash (seq 1,
ver 0, started now), its synthesis.started event and its place in the
active zset (so that a sweep times it out or cancels it), and is "held":
its entries stay pending to this consumer, acked by finalise_held when the
turn is published or stored by apply_entries if the worker spills it. No
entry is acked and no record stored here.

KEYS[1] events stream         KEYS[2] active zset
KEYS[2 + 3*(t-1) + 1..3]      per turn t: turn hash, done hash, cancel key

ARGV[1] events MAXLEN (~)     ARGV[2] number of turns T
ARGV[3]                       the turns: one msgpack array, per turn t an array
                              { tk, synthesis.started fields (an array) }
                              (one bulk string: the client packs each ARGV in
                              Python, the array in C)
ARGV[4]                       this consumer: the held turn's `holder`, so that
                              another worker's cancel sweep leaves it to this
                              one (finalise_turns); apply_entries removes it
                              when this consumer spills the turn

Returns { flat [tk, "held" | "old", ...], started (ms, as text) }
]==]

local events, active = KEYS[1], KEYS[2]
local events_max = ARGV[1]
local nturns = tonumber(ARGV[2])
local consumer = ARGV[4]

local t = redis.call('TIME')
local now_str = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))

local turns = cmsgpack.unpack(ARGV[3])
local statuses, members = {}, {}
for i = 1, nturns do
  local k = 2 + 3 * (i - 1)
  local tkey, dkey, ckey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local tk, started = turns[i][1], turns[i][2]
  local status = 'old'
  if redis.call('EXISTS', tkey, dkey, ckey) == 0 then
    redis.call('HSET', tkey, 'seq', '1', 'ver', '0', 'started', now_str, 'holder', consumer)
    redis.call('XADD', events, 'MAXLEN', '~', events_max, '*', unpack(started))
    members[#members + 1] = now_str
    members[#members + 1] = tk
    status = 'held'
  end
  statuses[#statuses + 1] = tk
  statuses[#statuses + 1] = status
end
if #members > 0 then redis.call('ZADD', active, unpack(members)) end
return { statuses, now_str }
