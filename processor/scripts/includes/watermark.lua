-- others_oldest: the oldest entry pending to any consumer but `consumer`
-- (padded), or nil when none is.
--- includes/pad_id
local function others_oldest(updates, group, consumer)
  local low
  for _, pair in ipairs(redis.call('XPENDING', updates, group)[4] or {}) do
    if pair[1] ~= consumer then
      local first = redis.call('XPENDING', updates, group, '-', '+', 1, pair[1])
      if first[1] and (not low or pad_id(first[1][1]) < low) then low = pad_id(first[1][1]) end
    end
  end
  return low
end

-- others_oldest_once: a function that gives others_oldest, looked up on
-- its first call only (false: none is pending), for a script that may need
-- it for several turns.
local function others_oldest_once(updates, group, consumer)
  local found
  return function()
    if found == nil then found = others_oldest(updates, group, consumer) or false end
    return found
  end
end

-- watermark: the padded id below which no entry that a stored turn may
-- still be missing is pending (nil when nothing is pending): the group's
-- oldest pending entry. With --hold-turns the calling consumer passes
-- `floor`, the oldest id it may have pending without having held or applied
-- it (its next batch not yet routed): its own pending entries below the
-- floor are all held, so they are skipped (the worker stores what it holds
-- of a turn before it finalises it on the stored path: worker.finalise);
-- the watermark is then the oldest of the floor and every other consumer's
-- oldest pending entry. floor '' = no skipping.
local function watermark(updates, group, consumer, floor)
  local summary = redis.call('XPENDING', updates, group)
  if tonumber(summary[1]) == 0 then return nil end
  local low = pad_id(summary[2])
  if floor == '' or low >= pad_id(floor) then return low end
  low = pad_id(floor)
  local others = others_oldest(updates, group, consumer)
  if others and others < low then return others end
  return low
end
