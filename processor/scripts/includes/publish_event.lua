-- publish_event: XADD one event whose JSON (the last field value) carries the
-- placeholder "seq":0, replaced by the turn's next seq (gap-free per turn).
-- Returns the entry's id (the event's JSON, numbered, is left in fields).
local function publish_event(tkey, events, events_max, fields)
  local seq = redis.call('HINCRBY', tkey, 'seq', 1) - 1
  local json = fields[#fields]
  local s, e = string.find(json, '"seq":0,', 1, true)
  fields[#fields] = string.sub(json, 1, s - 1) .. '"seq":' .. seq .. ',' .. string.sub(json, e + 1)
  return redis.call('XADD', events, 'MAXLEN', '~', events_max, '*', unpack(fields))
end
