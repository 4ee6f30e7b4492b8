-- publish_outcome: what a finalise publishes for a turn, exactly once: the
-- merged response, the terminal event (the turn's last seq), the AG-UI
-- entries (with --agui), the dead letters the replay found; then the done
-- marker (with its TTL) and the turn gone from the active zset and its hash
-- deleted. Expects merged, events, dlq, active, agui, merged_max,
-- events_max, dlq_max and done_ttl as locals of the including script.
--- includes/publish_event
local function publish_outcome(tkey, dkey, tk, status, outputs, dead)
  local out = cmsgpack.unpack(outputs)
  redis.call('XADD', merged, 'MAXLEN', '~', merged_max, '*', unpack(out[1]))
  publish_event(tkey, events, events_max, out[2])
  for _, fields in ipairs(out[3] or {}) do
    redis.call('XADD', agui, 'MAXLEN', '~', events_max, '*', unpack(fields))
  end
  for _, fields in ipairs(cmsgpack.unpack(dead)) do
    redis.call('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', unpack(fields))
  end
  redis.call('HSET', dkey, 'status', status, 'dropped', 0)
  redis.call('EXPIRE', dkey, done_ttl)
  redis.call('ZREM', active, tk)
  redis.call('DEL', tkey)
end
