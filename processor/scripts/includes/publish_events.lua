-- publish_events: a turn's events (parts, as includes/xadd_events takes them
-- from its first value) XADDed with the turn's next seqs, taken at once (one
-- HINCRBY; gap-free with publish_event, which takes one at a time).
--- includes/xadd_events
local function publish_events(tkey, events, rid, sid, attempt, parts)
  local count = #parts / 3
  local seq = redis.call('HINCRBY', tkey, 'seq', count) - count
  xadd_events(events, rid, sid, attempt, parts, 1, count, seq, nil)
end
