-- pending_to: whether `consumer` has any entry pending on `updates`.
local function pending_to(updates, group, consumer)
  return redis.call('XPENDING', updates, group, '-', '+', 1, consumer)[1] ~= nil
end
