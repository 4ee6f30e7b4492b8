-- number_events: XADD a turn's events to the events stream, numbered from
-- seq on (the turn's next seqs, which the caller took). Each element of found
-- is an event's field array whose last value is its JSON with the
-- placeholder "seq":0. No MAXLEN: the caller caps the stream once. Returns
-- the events' JSON texts, numbered.
local function number_events(events, found, seq)
  local jsons = {}
  for i, fields in ipairs(found) do
    local json = fields[#fields]
    local s, e = string.find(json, '"seq":0,', 1, true)
    json = string.sub(json, 1, s - 1) .. '"seq":' .. (seq + i - 1) .. ',' .. string.sub(json, e + 1)
    fields[#fields] = json
    redis.call('XADD', events, '*', unpack(fields))
    jsons[i] = json
  end
  return jsons
end
-- publish_events: number_events with the turn's next seqs taken at once (one
-- HINCRBY; gap-free with publish_event, which takes one at a time). Returns
-- the events' JSON texts, numbered, and the last seq taken.
local function publish_events(tkey, events, found)
  local count = #found
  local seq = redis.call('HINCRBY', tkey, 'seq', count) - count
  return number_events(events, found, seq), seq + count - 1
end
