-- require_group: fail the whole call, before its first write, when the
-- stream or its consumer group is gone (XPENDING answers NOGROUP). XACK on
-- a missing group answers 0, which the fences read as "another consumer
-- applied it", so every entry would be skipped without a word; Redis does
-- not roll a script back, hence the check first. The worker recreates the
-- group and gives its own pending entries back to itself, then calls again
-- (docs/design.md, Recovery).
local function require_group(updates, group)
  redis.call('XPENDING', updates, group)
end
