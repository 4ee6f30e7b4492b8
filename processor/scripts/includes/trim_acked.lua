-- trim_acked: after acks, remove what every consumer has acked from the
-- stream: everything below the group's oldest pending entry, in one XTRIM
-- MINID (whole listpack nodes freed, not entries marked deleted one by one);
-- with nothing pending, everything up to the last delivered entry. Uses
-- includes/last_delivered.
--- includes/last_delivered
local function trim_acked(updates, group)
  local pending = redis.call('XPENDING', updates, group)
  if tonumber(pending[1]) > 0 then
    redis.call('XTRIM', updates, 'MINID', pending[2])
    return
  end
  local last = last_delivered(updates, group)
  if last then
    redis.call('XTRIM', updates, 'MINID', last)
    redis.call('XDEL', updates, last)
  end
end
