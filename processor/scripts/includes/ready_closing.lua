-- ready_closing: closing members whose entry id is below the watermark
-- (includes/watermark: every earlier entry a stored turn may need has been
-- acked), so the turn has all its entries. O(1) for the watermark (XPENDING
-- summary) plus O(log n) for the range.
--- includes/watermark
local function ready_closing(updates, group, consumer, floor, closing, limit)
  local mark = watermark(updates, group, consumer, floor)
  local upper = '+'
  if mark then upper = '(' .. mark end
  return redis.call('ZRANGEBYLEX', closing, '-', upper, 'LIMIT', 0, limit)
end
