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

-- Most sweeps find no cancel at all: one EXISTS of many keys (it counts
-- them) per CHUNK turns says so, instead of one per turn (an idle worker
-- with 1,000 open turns made thousands of commands a second that way).
local CHUNK = 500  -- (well under Lua's limit on unpack's results)
local turns = (#KEYS - 1) / 2
local any = false
for first = 1, turns, CHUNK do
  local keys = {}
  for t = first, math.min(first + CHUNK - 1, turns) do keys[#keys + 1] = KEYS[2 * t] end
  if redis.call('EXISTS', unpack(keys)) > 0 then any = true break end
end
if not any then return { {}, {} } end

local ready, waiting = {}, {}
for t = 1, turns do
  local ckey, tkey = KEYS[2 * t], KEYS[2 * t + 1]
  if redis.call('EXISTS', ckey) == 1 then
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
  end
end
return { ready, waiting }
