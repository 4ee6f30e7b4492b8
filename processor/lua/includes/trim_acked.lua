-- trim_acked: after acks, remove what every consumer has acked from the
-- stream: everything below the group's oldest pending entry, in one XTRIM
-- MINID (whole listpack nodes freed, not entries marked deleted one by one);
-- with nothing pending, everything up to the last delivered entry.
local function trim_acked(updates, group)
  local pending = redis.call('XPENDING', updates, group)
  if tonumber(pending[1]) > 0 then
    redis.call('XTRIM', updates, 'MINID', pending[2])
    return
  end
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', updates)) do
    local name, last
    for j = 1, #info, 2 do
      if info[j] == 'name' then name = info[j + 1] end
      if info[j] == 'last-delivered-id' then last = info[j + 1] end
    end
    if name == group then
      redis.call('XTRIM', updates, 'MINID', last)
      redis.call('XDEL', updates, last)
      return
    end
  end
end
