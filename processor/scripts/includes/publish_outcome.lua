-- publish_outcome: what a finalise publishes for a turn, exactly once: the
-- merged response, the terminal event (the turn's last seq), the AG-UI
-- entries (with --agui), the dead letters the replay found; then the done
-- marker (with its TTL; it keeps the ids of the merged entry and of the
-- terminal event, which processor serve reads back with one XRANGE each)
-- and the turn gone from the active zset, its hash and its live log (what
-- processor serve joins a running turn from) deleted. Expects merged, events, dlq, active, agui, merged_max,
-- events_max, dlq_max and done_ttl as locals of the including script.
--- includes/publish_event
local function publish_outcome(tkey, dkey, lkey, tk, status, outputs, dead)
  local out = cmsgpack.unpack(outputs)
  local merged_id = redis.call('XADD', merged, 'MAXLEN', '~', merged_max, '*', unpack(out[1]))
  local terminal_id = publish_event(tkey, events, events_max, out[2])
  for _, fields in ipairs(out[3] or {}) do
    redis.call('XADD', agui, 'MAXLEN', '~', events_max, '*', unpack(fields))
  end
  for _, fields in ipairs(cmsgpack.unpack(dead)) do
    redis.call('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', unpack(fields))
  end
  redis.call('HSET', dkey, 'status', status, 'dropped', 0, 'merged_id', merged_id,
             'terminal_id', terminal_id)
  redis.call('EXPIRE', dkey, done_ttl)
  redis.call('ZREM', active, tk)
  redis.call('DEL', tkey, lkey)
end
