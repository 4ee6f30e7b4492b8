--[==[
compact_turn: replace a turn's stored records up to an entry id (the cover)
with one snapshot of its state after them, so a long turn keeps a bounded
number of records in Redis. The caller folded the records (settle.py
plan_compaction); this script only checks and swaps, atomically:

- the turn is still active (not done, not deleted by a finalise);
- the snapshot it extends is still the stored one (the turn hash's `cover`
  equals the expected cover): a concurrent compaction that won makes this
  one a no-op;
- the cover is below the shard's watermark (oldest pending entry): every
  earlier entry of the stream is applied, so no record at or below the cover
  can be stored later, and the records at or below it are final;
- the records at or below the cover are exactly the folded ones (same
  count, each present): none was applied after the caller read them, none
  was removed by someone else.

Only then the folded records are deleted and the snapshot stored in the
recs hash's `state` field, and the turn hash's `cover` moves. The turn's
`ver` is left alone: a finalise that read the turn before this swap renders
the same output (compaction never changes it), so it may still publish.

KEYS[1] updates stream   KEYS[2] turn hash   KEYS[3] recs hash   KEYS[4] done hash

ARGV[1] consumer group   ARGV[2] expected cover ("" = no snapshot yet)
ARGV[3] new cover (entry id)   ARGV[4] snapshot (msgpack)
ARGV[5..] the folded entry ids

Returns 1 compacted, 0 turn gone or done, -1 changed since the caller read it,
2 not yet (an entry at or below the cover is still pending)
]==]

local updates, tkey, rkey, dkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, expected, cover, snapshot = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local first, last = 5, #ARGV

--- includes/pad_id

if redis.call('EXISTS', dkey) == 1 or redis.call('EXISTS', tkey) == 0 then return 0 end
if (redis.call('HGET', tkey, 'cover') or '') ~= expected then return -1 end
local top = pad_id(cover)
local ok, pending = pcall(redis.call, 'XPENDING', updates, group)
if not ok then return 2 end
if tonumber(pending[1]) > 0 and pad_id(pending[2]) <= top then return 2 end

-- O(records), and a compaction runs once per threshold records: amortised O(1).
local below = 0
for _, field in ipairs(redis.call('HKEYS', rkey)) do
  if field ~= 'state' and pad_id(field) <= top then below = below + 1 end
end
if below ~= last - first + 1 then return -1 end
for i = first, last do
  if redis.call('HEXISTS', rkey, ARGV[i]) == 0 then return -1 end
end

-- unpack() takes a bounded number of values: delete in slices.
for i = first, last, 1000 do
  redis.call('HDEL', rkey, unpack(ARGV, i, math.min(i + 999, last)))
end
redis.call('HSET', rkey, 'state', snapshot)
redis.call('HSET', tkey, 'cover', cover)
return 1
