--[==[
repair_stream: bring a shard's updates stream back from ids that are
exhausted or far ahead of Redis's clock (an XADD with an explicit id, see
processor/wire/stream_ids.py), in one atomic step that loses no entry.

- Every entry whose id is past the limit (Redis's clock + ARGV[2] ms) moves
  to the DLQ whole: its original fields, then reason, detail, source_id (its
  old id) and deliveries (its delivery count, 0 if never delivered).
  `processor dlq replay` adds it back with a new id. One that every group
  has delivered and acked (a worker merged it) is only deleted.
- The stream is rebuilt under the scratch key: every other entry at its own
  id, the same consumer groups, each of their pending entries pending again
  to the same consumer with its delivery count and idle time (XCLAIM FORCE),
  then renamed over the old stream. (A stream's last id cannot be set below
  its newest entry, and Redis versions that check it also refuse to set it
  below the newest id ever deleted (7.0.15 does not): deleting the bad
  entries and XSETID is not enough.)
- Its last id becomes L, the newest of: the newest entry kept, the stream's
  and the groups' last ids that are not past the limit, and Redis's clock
  now. Every id given out below the limit is <= L, so XADD * goes on above.
- A group whose last-delivered-id is past the limit had delivered every
  entry below it: it gets L (no acked entry comes again). Any other group
  keeps its own (no undelivered entry is skipped). On Redis 7 the counters
  behind XINFO GROUPS' lag are set so that it stays exact: entries-added as
  it was, each group's entries-read that minus what it has not read yet (the
  new stream has no deleted entries, so Redis can count on from there).

Changes nothing when no id is past the limit ('fine'), or with ARGV[3] = 1
('plan': what it would do). Refused before any write: an entry with more
fields than one XADD from Lua can pass on (TOOMANYFIELDS), and a scratch key
that exists (BUSYREPAIR: an earlier repair failed half-way; look at the key,
then delete it).

KEYS[1] updates stream   KEYS[2] dlq stream   KEYS[3] scratch stream (same shard)

ARGV[1] DLQ reason   ARGV[2] how far ahead of Redis's clock an id may be (ms)
ARGV[3] 1: only report what would be done

Returns {status, last id before, last id after, entries dead-lettered,
entries past the limit already acked (deleted), entries kept, then per group: name, last-delivered-id before, after,
entries pending after, pending entries whose data was already gone (they
leave the pending list)}. status: 'missing' (no stream, nothing else
returned), 'fine', 'plan' or 'repaired'. With 'plan' the pending counts are
the group's before the repair.
]==]
--- includes/pad_id

local updates, dlq, scratch = KEYS[1], KEYS[2], KEYS[3]
local reason, ahead, plan_only = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local CHUNK = 200
local MAX_VALUES = 7000 -- names and values of one entry that unpack() can pass to XADD

if redis.call('EXISTS', updates) == 0 then return { 'missing' } end
if redis.call('EXISTS', scratch) == 1 then
  return redis.error_reply('BUSYREPAIR ' .. scratch .. ' exists: an earlier repair failed half-way')
end

local function map(flat)
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = flat[i + 1] end
  return m
end
local function after(a, b) return pad_id(a) > pad_id(b) end

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local limit = string.format('%.0f', now_ms + ahead) .. '-18446744073709551615'
local function bad(id) return after(id, limit) end

local stream = map(redis.call('XINFO', 'STREAM', updates))
local last = stream['last-generated-id']
local groups = {}
for i, g in ipairs(redis.call('XINFO', 'GROUPS', updates)) do groups[i] = map(g) end

local function result(status, new_last, dead, acked, kept)
  local out = { status, last, new_last, dead, acked, kept }
  for _, g in ipairs(groups) do
    for _, v in ipairs({ g['name'], g['last-delivered-id'], g.new_last or g['last-delivered-id'],
                         g.kept or g['pending'], g.lost or 0 }) do
      out[#out + 1] = v
    end
  end
  return out
end

local broken = bad(last)
for _, g in ipairs(groups) do broken = broken or bad(g['last-delivered-id']) end
if not broken then return result('fine', last, 0, 0, stream['length']) end

-- Calls fn(entry) for each entry of the stream from start to stop (ids, or - / +).
local function each(start, stop, fn)
  while true do
    local page = redis.call('XRANGE', updates, start, stop, 'COUNT', CHUNK)
    for _, entry in ipairs(page) do
      local err = fn(entry)
      if err then return err end
    end
    if #page < CHUNK then return nil end
    start = '(' .. page[#page][1]
  end
end
local function too_many(entry, extra)
  if #entry[2] + extra > MAX_VALUES then
    return redis.error_reply('TOOMANYFIELDS entry ' .. entry[1] .. ' has ' .. (#entry[2] / 2)
      .. ' fields: more than a repair can copy; delete it by hand (XDEL) and repair again')
  end
end

-- L: the newest id given out below the limit.
local new_last = string.format('%.0f', now_ms) .. '-0'
local function raise(id) if not bad(id) and after(id, new_last) then new_last = id end end
raise(last)
for _, g in ipairs(groups) do raise(g['last-delivered-id']) end
local newest = redis.call('XREVRANGE', updates, limit, '-', 'COUNT', 1)
if newest[1] then raise(newest[1][1]) end

for _, g in ipairs(groups) do
  g.new_last = bad(g['last-delivered-id']) and new_last or g['last-delivered-id']
  g.undelivered = 0
end

-- The plan: one pass over what is kept and what goes, checking each entry.
local kept, dead = 0, 0
local err = each('-', limit, function(entry)
  kept = kept + 1
  for _, g in ipairs(groups) do
    if after(entry[1], g.new_last) then g.undelivered = g.undelivered + 1 end
  end
  return too_many(entry, 0)
end)
if err then return err end
-- An entry's delivery count (the highest of the groups'), and whether every
-- group has delivered and acked it.
local function deliveries(id)
  local n, acked = 0, #groups > 0
  for _, g in ipairs(groups) do
    local p = redis.call('XPENDING', updates, g['name'], id, id, 1)
    if p[1] then
      acked = false
      if p[1][4] > n then n = p[1][4] end
    elseif after(id, g['last-delivered-id']) then
      acked = false
    end
  end
  return n, acked
end
local acked_bad = 0
err = each('(' .. limit, '+', function(entry)
  local _, acked = deliveries(entry[1])
  if acked then acked_bad = acked_bad + 1 else dead = dead + 1 end
  return too_many(entry, 8) -- the DLQ copy adds reason, detail, source_id, deliveries
end)
if err then return err end
if plan_only then return result('plan', new_last, dead, acked_bad, kept) end

-- 1. The bad entries to the DLQ, whole (unless acked).
local detail = 'id past Redis clock + ' .. ARGV[2] .. ' ms (' .. string.format('%.0f', now_ms) .. '): moved by '
  .. 'processor repair-stream; dlq replay adds it back with a new id'
each('(' .. limit, '+', function(entry)
  local n, acked = deliveries(entry[1])
  if acked then return end
  local fields = entry[2]
  for _, v in ipairs({ 'reason', reason, 'detail', detail, 'source_id', entry[1],
                       'deliveries', n }) do
    fields[#fields + 1] = v
  end
  redis.call('XADD', dlq, '*', unpack(fields))
end)

-- 2. The rest, at their own ids, under the scratch key.
each('-', limit, function(entry)
  redis.call('XADD', scratch, entry[1], unpack(entry[2]))
end)

-- 3. The groups, and their pending entries.
local added = stream['entries-added'] -- Redis 7.0+
for _, g in ipairs(groups) do
  if added then
    redis.call('XGROUP', 'CREATE', scratch, g['name'], g.new_last, 'MKSTREAM',
      'ENTRIESREAD', added - g.undelivered)
  else
    redis.call('XGROUP', 'CREATE', scratch, g['name'], g.new_last, 'MKSTREAM')
  end
  g.kept, g.lost = 0, 0
  local start = '-'
  while true do
    local page = redis.call('XPENDING', updates, g['name'], start, '+', CHUNK)
    for _, p in ipairs(page) do
      if not bad(p[1]) then
        local claimed = redis.call('XCLAIM', scratch, g['name'], p[2], 0, p[1], 'IDLE', p[3],
          'RETRYCOUNT', p[4], 'FORCE', 'JUSTID')
        if claimed[1] then g.kept = g.kept + 1 else g.lost = g.lost + 1 end
      end
    end
    if #page < CHUNK then break end
    start = '(' .. page[#page][1]
  end
end

-- 4. The last id (and, on Redis 7, the counters behind the lag), then the swap.
if redis.call('EXISTS', scratch) == 0 then -- nothing kept and no group
  redis.call('XADD', scratch, new_last, 'repair', '1')
  redis.call('XDEL', scratch, new_last)
end
if added then
  redis.call('XSETID', scratch, new_last, 'ENTRIESADDED', added)
else
  redis.call('XSETID', scratch, new_last)
end
redis.call('DEL', updates)
redis.call('RENAME', scratch, updates)
return result('repaired', new_last, dead, acked_bad, kept)
