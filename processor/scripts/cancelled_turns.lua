--[==[
cancelled_turns: which of a slice of a shard's active turns have a
cancellation key, and of those which a finalise can publish now. Only the
keys' existence is read, never their values: a reason of any size costs the
worker nothing (docs/contract.md §6: anyone may set the key).

A cancelled turn is left out (for a later sweep) while another live worker
holds it (its hash's `holder`, with entries still pending to that consumer:
that worker publishes it) or while an entry up to its cut (includes/cancel_cut)
is still pending: finalise_turns would answer "not yet", after reading and
replaying the turn's records for nothing. This script writes nothing.

KEYS[1] updates stream
KEYS[1 + 2*(t-1) + 1..2]   per turn t: cancellation key, turn hash

ARGV[1] consumer group   ARGV[2] this consumer   ARGV[3] its floor (includes/watermark)

Returns { the (1-based) indexes of the turns to finalise as cancelled now,
those of the cancelled turns that must wait } (a turn in neither is not
cancelled, or not active any more)
]==]

local updates = KEYS[1]
local group, consumer, floor = ARGV[1], ARGV[2], ARGV[3]

--- includes/pad_id
--- includes/watermark
--- includes/pending_to

local mark, marked = nil, false
local function watermark_once()
  if not marked then
    marked = true
    local ok, found = pcall(watermark, updates, group, consumer, floor)
    if ok then mark = found end
  end
  return mark
end

local CHUNK = 500
local turns = (#KEYS - 1) / 2

local ready, waiting = {}, {}
local function look(t)  -- whether turn t's cancellation key exists
  local ckey, tkey = KEYS[2 * t], KEYS[2 * t + 1]
  if redis.call('EXISTS', ckey) == 0 then return false end
  local state = redis.call('HMGET', tkey, 'started', 'holder', 'cut')
  local started, holder, cut = state[1], state[2], state[3]
  if started then
    local wait = false
    if holder and holder ~= consumer and pending_to(updates, group, holder) then
      wait = true
    elseif cut then
      local low = watermark_once()
      wait = low ~= nil and low < cut
    end
    if wait then waiting[#waiting + 1] = t else ready[#ready + 1] = t end
  end
  return true
end

for first = 1, turns, CHUNK do
  local last = math.min(turns, first + CHUNK - 1)
  local ckeys = {}
  for t = first, last do ckeys[t - first + 1] = KEYS[2 * t] end
  local found = redis.call('EXISTS', unpack(ckeys))
  local t = first
  while found > 0 and t <= last do  -- (stops at the chunk's last cancelled turn)
    if look(t) then found = found - 1 end
    t = t + 1
  end
end
return { ready, waiting }
