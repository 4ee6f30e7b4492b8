-- ready_closing: closing members whose entry id is below the shard's
-- watermark (the oldest pending entry): every earlier entry of the stream has
-- been acked, so the turn has all its entries. O(1) for the watermark
-- (XPENDING summary) plus O(log n) for the range.
local function ready_closing(updates, group, closing, limit)
  local pending = redis.call('XPENDING', updates, group)
  local upper = '+'
  if tonumber(pending[1]) > 0 then upper = '(' .. pad_id(pending[2]) end
  return redis.call('ZRANGEBYLEX', closing, '-', upper, 'LIMIT', 0, limit)
end
