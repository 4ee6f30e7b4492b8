--[==[
checkpoint_held: store what this worker holds of turns held for --hold-ms
as one snapshot each, and ack their entries, so that a long turn stays held
(merged in this worker's memory only) instead of storing a record per entry
from then on (docs/design.md, "Held turns").

For each turn, atomically, unless it is done or gone (0), or its version
moved since this worker last saw it or another consumer (or none) holds it
(-1: some consumer stored, dropped or dead-lettered one of its entries, or
the turn was spilled), or its cancel key exists (3: the stored path cuts
and publishes it), or an entry older than the cover is pending to another
consumer (2: a worker that read it died; it may be this turn's, which the
snapshot would miss and a replay would put after the snapshot once it is
reclaimed; the caller spills the turn, whose records replay in id order):
XACK the entries this consumer holds of it (every entry
of the turn up to the newest it routed: XREADGROUP delivers in id order,
and an entry of the turn another consumer acked meanwhile moved the
version), store the snapshot of the turn's state after them in its recs
hash's `state` field (what compact_turn.lua stores, its cover the newest of
those entries), set the turn's `ver`, `n` and `bytes` as apply_entries would
have after storing them, and its correlation ids (`id:<name>`, first wins);
and, as apply_entries does for a turn it stores entries of, its score in
the active zset is now (a turn is idle, for the sweep's timeout, from its
last applied entry on: its checkpointed entries are applied).
The stream is trimmed of what is acked. The turn stays held: its next
entries are pending to this consumer until its finalise_held (which checks
the new version) or a spill (apply_entries stores them after the
snapshot). Should this worker die, the stored path finalises the turn from
the snapshot and the entries after it, as it does a compacted turn.

KEYS[1] updates stream     KEYS[2] active zset
KEYS[2 + 4*(t-1) + 1..4]   per turn t: turn hash, recs hash, done hash, cancel key

ARGV[1] consumer group     ARGV[2] this consumer      ARGV[3] number of turns T
ARGV[4]                    the turns: one msgpack array, per turn t an array
                           { tk, expected version, new version, n, bytes,
                           snapshot (msgpack), cover (entry id), the held
                           entry ids (an array), correlation ids (flat
                           [name, JSON value, ...]) }

Returns one integer per turn: 1 checkpointed (also when this very call ran
before: the turn's version, cover and holder are the ones it set), 0 done
or gone, -1 changed (also when its recs hash holds a record: another
consumer stored an entry of it, which a version that happens to match
would hide), 2 an older entry pending elsewhere, 3 cancelled.
]==]

local updates, active = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
local nturns = tonumber(ARGV[3])

--- includes/trim_acked
--- includes/watermark
--- includes/require_group

require_group(updates, group)

-- The oldest entry pending to another consumer, looked up once, on the
-- first turn that needs it (false: none is).
local others_first = others_oldest_once(updates, group, consumer)

local now = redis.call('TIME')
local now_str = tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))

local turns = cmsgpack.unpack(ARGV[4])
local results, acked, members = {}, false, {}
for t = 1, nturns do
  local k = 2 + 4 * (t - 1)
  local tkey, rkey, dkey, ckey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local tk, expected, version, n, bytes, snapshot, cover, ids, named = unpack(turns[t], 1, 9)
  if redis.call('EXISTS', dkey) == 1 or redis.call('EXISTS', tkey) == 0 then
    results[t] = 0
  else
    local got = redis.call('HMGET', tkey, 'ver', 'holder', 'cover')
    -- A held turn has no record: its recs hash holds at most its last
    -- checkpoint's snapshot. A record means another consumer stored one of
    -- its entries (reclaimed from this one), whatever the version says.
    local records = redis.call('HLEN', rkey) - redis.call('HEXISTS', rkey, 'state')
    if got[1] == tostring(version) and got[2] == consumer and got[3] == cover
        and records == 0 then
      results[t] = 1  -- (this very call ran before: its reply was lost)
    elseif (got[1] or '0') ~= expected or got[2] ~= consumer or records > 0 then
      results[t] = -1
    elseif redis.call('EXISTS', ckey) == 1 then
      results[t] = 3
    elseif others_first() and others_first() < pad_id(cover) then
      results[t] = 2
    else
      for j = 1, #ids, 1000 do
        redis.call('XACK', updates, group, unpack(ids, j, math.min(j + 999, #ids)))
      end
      acked = acked or #ids > 0
      redis.call('HSET', rkey, 'state', snapshot)
      redis.call('HSET', tkey, 'ver', version, 'n', n, 'bytes', bytes, 'cover', cover)
      for j = 1, #named, 2 do redis.call('HSETNX', tkey, 'id:' .. named[j], named[j + 1]) end
      members[#members + 1] = now_str
      members[#members + 1] = tk
      results[t] = 1
    end
  end
end
if #members > 0 then redis.call('ZADD', active, unpack(members)) end
if acked then trim_acked(updates, group) end
return results
