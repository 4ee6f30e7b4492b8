-- cancel_check: for turns whose cancellation keys exist, whether each is to
-- be finalised as cancelled now or must wait; used by cancelled_turns and
-- sweep_shard, which read the keys' existence (never their values: a reason
-- of any size costs the worker nothing, docs/contract.md §6) in chunks of
-- CANCEL_CHUNK keys, one multi-key EXISTS each, then look at each turn of
-- a chunk that has a cancel.
--
-- A cancelled turn waits (for a later sweep) while another live worker
-- holds it (its hash's `holder`, with entries still pending to that
-- consumer: that worker publishes it) or while an entry up to its cut
-- (includes/cancel_cut) is still pending: finalise_turns would answer "not
-- yet", after reading and replaying the turn's records for nothing. A turn
-- not started (no `started` in its hash: not active any more) is neither.
--- includes/watermark
--- includes/pending_to
local CANCEL_CHUNK = 500

-- For turns 1..n, whose cancellation key and turn hash ckey(t) and tkey(t)
-- name: { the ts to finalise now }, { the ts that must wait }.
local function cancel_check(n, ckey, tkey, updates, group, consumer, floor)
  local mark, marked = nil, false
  local function watermark_once()
    if not marked then
      marked = true
      local ok, found = pcall(watermark, updates, group, consumer, floor)
      if ok then mark = found end
    end
    return mark
  end
  local ready, waiting = {}, {}
  local function look(t)  -- whether turn t's cancellation key exists
    if redis.call('EXISTS', ckey(t)) == 0 then return false end
    local state = redis.call('HMGET', tkey(t), 'started', 'holder', 'cut')
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
  for first = 1, n, CANCEL_CHUNK do
    local last = math.min(n, first + CANCEL_CHUNK - 1)
    local ckeys = {}
    for t = first, last do ckeys[t - first + 1] = ckey(t) end
    local found = redis.call('EXISTS', unpack(ckeys))
    local t = first
    while found > 0 and t <= last do  -- (stops at the chunk's last cancelled turn)
      if look(t) then found = found - 1 end
      t = t + 1
    end
  end
  return ready, waiting
end
