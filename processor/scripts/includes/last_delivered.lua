-- last_delivered: the consumer group's last-delivered-id on `updates` (XINFO
-- GROUPS: O(groups)), or nil when the group does not exist.
local function last_delivered(updates, group)
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', updates)) do
    local name, last
    for j = 1, #info, 2 do
      if info[j] == 'name' then name = info[j + 1] end
      if info[j] == 'last-delivered-id' then last = info[j + 1] end
    end
    if name == group then return last end
  end
  return nil
end
