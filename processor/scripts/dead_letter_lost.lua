--[==[
dead_letter_lost: account for entries deleted from the stream while they
were pending (a trim, an XDEL): their data is gone, so they cannot be
merged, dead-lettered with their fields or replayed. Each gets a DLQ entry
without fields (reason entry_lost, given by the caller; source_id = its id), and the turns that
may have lost it are marked, so that they end as error entries_lost
instead of completing without it (docs/reliability.md says which turns).

Atomically: XACK the ids still pending to this consumer (Redis 6.2 reports
a deleted entry as a nil entry and leaves it pending; so does a read of a
consumer's own pending entries) and dead-letter those it acked (1: another
consumer may have taken the same id); dead-letter the ids XAUTOCLAIM
already removed from the pending list (Redis 7 reports them apart, to one
caller); then mark each given turn that is still active (hash present, not
done): `lost` = the first lost id (kept if already set) and a new `ver`, so
that any copy of the turn (a worker's mirror, a held turn) no longer
matches and its finalise replays it from Redis, where `lost` is seen.

KEYS[1] updates stream   KEYS[2] dlq stream
KEYS[2 + 2*(t-1) + 1..2]   per turn t: turn hash, done hash

ARGV[1] consumer group   ARGV[2] dlq MAXLEN (~)   ARGV[3] reason   ARGV[4] detail
ARGV[5] number P of ids still pending to this consumer
ARGV[6] number T of turns to mark   ARGV[7] the first lost id (for `lost`)
ARGV[8..7+P] ids still pending      ARGV[8+P..] ids already removed

Called without ids, it only marks the turns (the caller's further batches
of them, after a call that dead-lettered some).

Returns { the ids dead-lettered, the number of turns marked }
]==]

local updates, dlq = KEYS[1], KEYS[2]
local group, dlq_max, reason, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local npending, nturns, first = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local lost = {}
for j = 8, #ARGV do
  local id = ARGV[j]
  if j >= 8 + npending or redis.call('XACK', updates, group, id) == 1 then
    redis.call('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', 'reason', reason,
               'detail', detail, 'source_id', id, 'deliveries', '0')
    lost[#lost + 1] = id
  end
end
local marked = 0
if #lost > 0 or #ARGV == 7 then  -- (no ids: a further batch of turns to mark)
  for t = 1, nturns do
    local tkey, dkey = KEYS[2 + 2 * (t - 1) + 1], KEYS[2 + 2 * (t - 1) + 2]
    if redis.call('EXISTS', dkey) == 0 and redis.call('EXISTS', tkey) == 1 then
      redis.call('HSETNX', tkey, 'lost', first)
      redis.call('HINCRBY', tkey, 'ver', 1)
      marked = marked + 1
    end
  end
end
return { lost, marked }
