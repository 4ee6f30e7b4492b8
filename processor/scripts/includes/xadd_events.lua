-- xadd_events: XADD a turn's events to the events stream, numbered from seq
-- on (the turn's next seqs, which the caller took). parts[from..] holds
-- count events, three values each (processor.scripts.calls.cut_events): its
-- type, its JSON up to and including `"seq":`, its JSON after the seq's 0;
-- rid, sid and attempt ('' none) are the turn's ids, the entries' other
-- fields. No MAXLEN: the caller caps the stream once.
--
-- Redis's Lua hashes every string it makes, byte by byte: each event's JSON
-- is made once, joined with its seq. Returns the numbered JSON texts in a
-- table that table.concat makes one JSON array text of:
-- { '[', json 1, ',', ..., json count, ']' } ({ '[', ']' } for none).
local function xadd_events(events, rid, sid, attempt, parts, from, count, seq)
  local texts = {'['}
  for i = 0, count - 1 do
    local k = from + 3 * i
    local json = parts[k + 1] .. (seq + i) .. parts[k + 2]
    if attempt == '' then
      redis.call('XADD', events, '*', 'type', parts[k], 'response_id', rid,
                 'synthesis_id', sid, 'event', json)
    else
      redis.call('XADD', events, '*', 'type', parts[k], 'response_id', rid,
                 'synthesis_id', sid, 'attempt_id', attempt, 'event', json)
    end
    texts[2 * i + 2], texts[2 * i + 3] = json, ','
  end
  texts[math.max(2, 2 * count + 1)] = ']'  -- (in place of the last ',')
  return texts
end
