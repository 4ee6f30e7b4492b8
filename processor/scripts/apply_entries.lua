--[==[
apply_entries: apply a batch of entries read from one shard's updates stream.

For each entry, atomically: XACK it (the fence: an entry another consumer
already acked is skipped, so every entry is applied exactly once), then
either dead-letter it, drop it (cancelled turn) or store its record in
the turn's state, publishing synthesis.started on a turn's first entry (a
running turn's other events are live progress: publish_live.lua). A turn's
correlation ids (first value applied wins) are kept in its hash and filled
into synthesis.started when it does not carry them itself, so that every
event of the turn has them (docs/contract.md §3.1). Acked entries
leave the stream at the end: everything below the group's oldest pending
entry (every one of them acked) in one XTRIM MINID, which frees whole
listpack nodes instead of marking entries deleted one XDEL at a time.

Finally report which turns are ready to finalise: turns found cancelled, and
turns whose closing entry (end, error, limit) lies below the shard's
watermark, i.e. every earlier entry of the stream has been acked; and which
turns to compact (compact_turn.lua): a store brought their recs hash to the
threshold, or to the threshold plus a multiple of half of it (so a
compaction that could not fold much is retried after that many more records,
not on every store).

KEYS[1] updates stream        KEYS[2] events stream
KEYS[3] dlq stream            KEYS[4] active zset
KEYS[5] closing zset
KEYS[5 + 4*(t-1) + 1..4]      per turn t: turn hash, recs hash, done hash, cancel key

ARGV[1] consumer group        ARGV[2] events MAXLEN (~)
ARGV[3] dlq MAXLEN (~)        ARGV[4] number of turns T
ARGV[5] max updates per turn  ARGV[6] max bytes per turn
ARGV[7] most names and values of an entry copied into the DLQ as fields
ARGV[8] ready limit (closing members returned at most)
ARGV[9] compaction threshold (stored records of a turn; 0 = never)
ARGV[10] seconds a turn's dead letters are remembered before its first entry
ARGV[11] this consumer        ARGV[12] its floor (includes/watermark; '' = none)
ARGV[13] the first entry id of the XREADGROUP > read the entries come from ('' =
         not such a read: a spill, a reclaim, a take-back), for the cut
ARGV[14 + 2*(t-1) + 0..1]     per turn t: tk, synthesis.started fields (msgpack array)
ARGV[14 + 2*T]                the entries: one msgpack array, 7 values per entry:
                              id, turn index (0 = none), op, a, b, deliveries, ids
  op "u" update / "e" end|error: a = stored record, b = size, ids = the entry's
                                  turn-level ids (msgpack [name, JSON value, ...]) or ""
  op "d" dead letter:            a = reason, b = detail

Returns { cancelled tks, ready closing members, counts, tks to compact,
versions } where counts is a flat [name, n, ...] of what this call did, for
the worker's metrics: "stored", "dropped" and "dlq:<reason>" (only the names
that occurred), and versions is a flat [tk, ver before, ver after, records
stored, started, ...] for each turn this call stored, dropped or dead-lettered
entries of (each of these moves the turn's ver).
]==]

local updates, events, dlq, active, closing = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group = ARGV[1]
local events_max, dlq_max = ARGV[2], ARGV[3]
local nturns = tonumber(ARGV[4])
local max_updates, max_bytes = tonumber(ARGV[5]), tonumber(ARGV[6])
local dlq_fields_max = tonumber(ARGV[7])
local ready_limit = tonumber(ARGV[8])
local compact_at = tonumber(ARGV[9])
local compact_step = math.max(1, math.floor(compact_at / 2))
local unstarted_ttl = ARGV[10]
local consumer, floor, read_from = ARGV[11], ARGV[12], ARGV[13]
local TURNS = 14  -- ARGV index of the first turn's tk

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Made a string once: redis.call formats every number argument with
-- snprintf("%.17g"), about 2,400 instructions each time.
local now_str = tostring(now_ms)

--- includes/pad_id
--- includes/dead_letter
--- includes/last_delivered
--- includes/trim_acked
--- includes/cancel_cut
--- includes/require_group

require_group(updates, group)

local cancelled, seen_cancel = {}, {}
local counts = {}
-- Called last in each branch, so a failing branch is counted once, as internal_error.
local function count(name) counts[name] = (counts[name] or 0) + 1 end
local full, seen_full = {}, {}
local function turn_keys(ti)
  local k = 5 + 4 * (ti - 1)
  return KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
end

-- What this call learnt about each turn (by index), so a turn's many entries
-- in one batch read its done marker, cancel key and flags once: nothing else
-- changes them while the script runs. false = looked up, absent.
local status_of, cancel_of, closing_of, has_hash, touched, cut_of = {}, {}, {}, {}, {}, {}
-- Turns whose cut this call recorded (the first to see the key): the
-- newest entry stored of each then (padded, '' none).
local cut_here = {}
local function cached(cache, ti, fn, key)
  local v = cache[ti]
  if v == nil then v = fn(key) or false; cache[ti] = v end
  return v
end
-- The lookups cached above, as named functions: a closure made per entry
-- cost more than the lookup it saved.
local function exists(key) return redis.call('EXISTS', key) == 1 end
-- A turn has started once its hash has `started` (a hash may hold only the
-- count of dead letters that came before its first entry).
local function started(tkey) return redis.call('HEXISTS', tkey, 'started') == 1 end
local function done_status(dkey) return redis.call('HGET', dkey, 'status') end
local function has_closing(tkey) return redis.call('HEXISTS', tkey, 'closing') == 1 end

-- The turn's remembered ids ("id:<name>" = JSON value) replace the event's
-- "<name>":null (the base fields come first in every event's JSON).
local function fill_ids(tkey, fields)
  local json = fields[#fields]
  local hash = redis.call('HGETALL', tkey)
  for j = 1, #hash, 2 do
    local name = string.match(hash[j], '^id:(.+)$')
    if name then
      local s, e = string.find(json, '"' .. name .. '":null', 1, true)
      if s then json = string.sub(json, 1, s - 1) .. '"' .. name .. '":' .. hash[j + 1] .. string.sub(json, e + 1) end
    end
  end
  fields[#fields] = json
  return fields
end

local function remember_ids(tkey, ids)
  if ids == '' then return end
  local flat = cmsgpack.unpack(ids)
  for j = 1, #flat, 2 do redis.call('HSETNX', tkey, 'id:' .. flat[j], flat[j + 1]) end
end

-- Create the turn's hash if missing; publish synthesis.started once the
-- first entry's ids are remembered. Returns nothing.
local function start_turn(ti, tkey, ids)
  if cached(has_hash, ti, started, tkey) then
    remember_ids(tkey, ids)
    return
  end
  has_hash[ti] = true
  redis.call('HSET', tkey, 'seq', '1', 'ver', '0', 'started', now_str)
  if redis.call('PERSIST', tkey) == 1 then
    -- Dead letters came before its first entry (their count waited here,
    -- with a TTL): version 1, so that no worker's copy, which never saw
    -- them, stands for the turn; its finalise reads the count back.
    redis.call('HSET', tkey, 'ver', '1')
  end
  remember_ids(tkey, ids)
  local fields = fill_ids(tkey, cmsgpack.unpack(ARGV[TURNS + 2 * (ti - 1) + 1]))
  redis.call('XADD', events, 'MAXLEN', '~', events_max, '*', unpack(fields))
end

-- Turns whose entries this call stores through apply_one's last branch (no
-- outcome, not closing, not cancelled): their done marker and cancel key
-- cannot change while the script runs and only mark_closing changes the
-- closing flag (it clears this one), so their further entries skip the three
-- lookups.
local open_turn = {}

local function mark_closing(ti, tkey, tk, id)
  closing_of[ti] = true
  open_turn[ti] = nil
  local member = pad_id(id) .. '|' .. tk
  local current = redis.call('HGET', tkey, 'closing')
  if current and current <= member then return end
  if current then redis.call('ZREM', closing, current) end
  redis.call('ZADD', closing, '0', member)
  redis.call('HSET', tkey, 'closing', member)
end

-- A turn's counters (ver, n, bytes, HLEN of recs), read once per call and
-- written back once at the end (flush_counters): the script is atomic, so
-- nothing else sees them in between, and a stored entry costs its XACK and
-- its HSET instead of five calls.
local counters = {}
local function counters_of(ti, tkey, rkey)
  local c = counters[ti]
  if c then return c end
  local v = redis.call('HMGET', tkey, 'ver', 'n', 'bytes', 'started', 'holder')
  local ver = tonumber(v[1]) or 0
  c = { ver0 = ver, ver = ver, n = tonumber(v[2]) or 0, bytes = tonumber(v[3]) or 0,
        started = v[4] or '', holder = v[5], stored = 0, len = 0 }
  if compact_at > 0 then c.len = redis.call('HLEN', rkey) end
  counters[ti] = c
  return c
end

-- A dead letter of a started turn: counted in its hash, under a new version,
-- so that the worker's copy of the turn (which never saw the entry) no longer
-- matches it and its finalise reads the count back (worker.py, mirror.py).
local function count_dead(ti)
  local tkey, rkey = turn_keys(ti)
  redis.call('HINCRBY', tkey, 'dlq', 1)
  local c = counters_of(ti, tkey, rkey)
  c.ver = c.ver + 1
end

local function store(ti, id, op, record, size, ids)
  local tkey, rkey = turn_keys(ti)
  local tk = ARGV[TURNS + 2 * (ti - 1)]
  -- (A turn this call already found or made the hash of has nothing to start.)
  if ids ~= '' or not has_hash[ti] then start_turn(ti, tkey, ids) end
  local c = counters_of(ti, tkey, rkey)
  redis.call('HSET', rkey, id, record)
  c.len = c.len + 1
  if compact_at > 0 and not seen_full[tk] and c.len >= compact_at
      and (c.len - compact_at) % compact_step == 0 then
    seen_full[tk] = true
    full[#full + 1] = tk
  end
  c.ver, c.stored, c.bytes = c.ver + 1, c.stored + 1, c.bytes + size
  if op == 'u' then c.n = c.n + 1 end
  touched[ti] = tk
  if op == 'e' or c.n > max_updates or c.bytes > max_bytes then mark_closing(ti, tkey, tk, id) end
  if op == 'e' then
    local ended = redis.call('HGET', tkey, 'ended')
    if not ended or pad_id(id) < ended then redis.call('HSET', tkey, 'ended', pad_id(id)) end
  end
end

-- A turn whose cancel key this call found: the caller finalises it.
local function report_cancelled(ti)
  local tk = ARGV[TURNS + 2 * (ti - 1)]
  -- Active, so that a sweep finalises it if this worker dies before doing so.
  touched[ti] = tk
  if not seen_cancel[tk] then
    seen_cancel[tk] = true
    cancelled[#cancelled + 1] = tk
  end
end

local function drop(ti)
  local tkey = turn_keys(ti)
  start_turn(ti, tkey, '')
  redis.call('HINCRBY', tkey, 'dropped', 1)
  local c = counters_of(ti, tkey, select(2, turn_keys(ti)))
  c.ver = c.ver + 1
end

local function apply_one(id, ti, op, a, b, deliveries, ids)
  if open_turn[ti] and op ~= 'd' then
    store(ti, id, op, a, tonumber(b), ids)
    count('stored')
    return
  end
  if op == 'd' then
    dead_letter(updates, dlq, dlq_max, dlq_fields_max, id, a, b, deliveries)
    if ti > 0 then
      local tkey = turn_keys(ti)
      if cached(has_hash, ti, started, tkey) then
        count_dead(ti)
      else
        -- Not started: the count waits in the turn's hash (with a TTL, in
        -- case it never starts) for start_turn, so meta counts it.
        redis.call('HINCRBY', tkey, 'dlq', 1)
        redis.call('EXPIRE', tkey, unstarted_ttl)
      end
    end
    count('dlq:' .. a)
    return
  end
  local tkey, _, dkey, ckey = turn_keys(ti)
  local status = cached(status_of, ti, done_status, dkey)
  if status == 'cancelled' then
    redis.call('HINCRBY', dkey, 'dropped', 1)
    count('dropped')
  elseif status then
    dead_letter(updates, dlq, dlq_max, dlq_fields_max, id, 'turn_closed', 'the turn had already ended', deliveries)
    count('dlq:turn_closed')
  elseif cached(closing_of, ti, has_closing, tkey) then
    -- Its end (or limit) was applied before any cancel was seen: the cancel
    -- changes nothing. An entry after an applied end is turn_closed whatever
    -- else comes (dead-lettered now, with its original fields); any other is
    -- replayed (merged, or dead-lettered by the replay).
    local ended = redis.call('HGET', tkey, 'ended')
    if ended and pad_id(id) > ended then
      dead_letter(updates, dlq, dlq_max, dlq_fields_max, id, 'turn_closed', 'the turn had already ended', deliveries)
      count_dead(ti)
      count('dlq:turn_closed')
    else
      store(ti, id, op, a, tonumber(b), ids)
      count('stored')
    end
  elseif cached(cancel_of, ti, exists, ckey) then
    -- Cancelled and not ended: an entry at or below the turn's cut (the
    -- newest entry delivered when the cancel was first seen) is merged, a
    -- later one dropped (includes/cancel_cut). Entries a worker held in its
    -- memory (a spill) or read before it died are below the cut.
    local cut = cut_of[ti]
    if not cut then
      cut = redis.call('HGET', tkey, 'cut')
      if not cut then  -- this call is the first to see the key
        local rkey = select(2, turn_keys(ti))
        cut_here[ti] = newest_stored(tkey, rkey)
        cut = record_cut(tkey, rkey, updates, group, cached(has_hash, ti, started, tkey),
                         read_from, cut_here[ti])
      end
      cut_of[ti] = cut
    end
    if op == 'e' and cut_here[ti] and pad_id(id) < cut and pad_id(id) > cut_here[ti] then
      -- The first to see the key, with the turn's end (or error) in hand:
      -- the end is taken in while the key exists, so the turn ends
      -- cancelled without it (docs/contract.md §6), as finalise_held cuts
      -- a held turn at its end. A take-back, a reclaim or a spill (no
      -- read_from) would have cut after it. Nothing of the turn after its
      -- end is merged (unless stored already: then the end stays).
      cut = pad_id(id)
      redis.call('HSET', tkey, 'cut', cut)
      cut_of[ti] = cut
    end
    report_cancelled(ti)
    if pad_id(id) < cut then
      store(ti, id, op, a, tonumber(b), ids)
      count('stored')
    else
      drop(ti)
      count('dropped')
    end
  else
    open_turn[ti] = true
    store(ti, id, op, a, tonumber(b), ids)
    count('stored')
  end
end

local E = cmsgpack.unpack(ARGV[TURNS + 2 * nturns])
local acked = {}
for i = 1, #E, 7 do
  local id = E[i]
  if redis.call('XACK', updates, group, id) == 1 then
    local ok, err = pcall(apply_one, id, tonumber(E[i + 1]), E[i + 2], E[i + 3],
                          E[i + 4], E[i + 5], E[i + 6])
    if not ok then
      -- A bug here must not lose the acked entry (scripts are not rolled
      -- back): it goes to the DLQ, with its fields if that still works.
      local detail = 'applying the entry failed: ' .. tostring(type(err) == 'table' and err.err or err)
      if not pcall(dead_letter, updates, dlq, dlq_max, dlq_fields_max, id, 'internal_error', detail, E[i + 5]) then
        redis.call('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', 'reason', 'internal_error',
                   'detail', detail, 'source_id', id, 'deliveries', E[i + 5])
      end
      count('dlq:internal_error')
    end
    acked[#acked + 1] = id
  end
end
if #acked > 0 then trim_acked(updates, group) end
-- Write back the counters (see counters_of), and tell the caller each
-- turn's version before and after this call, what it stored and when the
-- turn started: the worker keeps its own mirror of a turn's merge only while
-- it stored every record of the turn (mirror.Mirror), and then need not
-- read the records back to finalise it.
local versions = {}
for ti, c in pairs(counters) do
  local tkey = turn_keys(ti)
  if c.ver ~= c.ver0 then
    redis.call('HSET', tkey, 'ver', c.ver, 'n', c.n, 'bytes', c.bytes)
  end
  -- The worker that held the turn (open_turns) stores its entries: it spilled
  -- the turn, which is a stored turn from now on.
  if c.holder == consumer then redis.call('HDEL', tkey, 'holder') end
  versions[#versions + 1] = ARGV[TURNS + 2 * (ti - 1)]
  versions[#versions + 1] = c.ver0
  versions[#versions + 1] = c.ver
  versions[#versions + 1] = c.stored
  versions[#versions + 1] = c.started ~= '' and c.started or now_str
end

-- The turns this call stored or dropped entries of, now active (one ZADD).
local members = {}
for _, tk in pairs(touched) do members[#members + 1] = now_str; members[#members + 1] = tk end
for j = 1, #members, 1000 do
  redis.call('ZADD', active, unpack(members, j, math.min(j + 999, #members)))
end

--- includes/watermark
--- includes/ready_closing
local flat = {}
for name, n in pairs(counts) do flat[#flat + 1] = name; flat[#flat + 1] = n end
return { cancelled, ready_closing(updates, group, consumer, floor, closing, ready_limit), flat, full, versions }
