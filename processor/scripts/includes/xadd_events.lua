-- xadd_events: XADD a turn's events to the events stream, numbered from seq
-- on (the turn's next seqs, which the caller took; first: seq as text, as
-- the turn hash holds it, or nil). parts[from..] holds count events, three
-- values each (processor.scripts.calls.cut_events): its type, its JSON up to
-- and including `"seq":`, its JSON after the seq's 0; rid, sid and attempt
-- ('' none) are the turn's ids, the entries' other fields. No MAXLEN: the
-- caller caps the stream once.
--
-- Redis's Lua hashes every string it makes, byte by byte, and spells a
-- number with printf's %.14g: each event's JSON is made once, joined with
-- its seq, spelt by string.format('%d') (or given). Returns the numbered
-- JSON texts in a table that table.concat makes one JSON array text of,
-- { '[', json 1, ',', ..., json count, ']' } ({ '[', ']' } for none), and
-- the last seq as text (nil for none).
local function xadd_events(events, rid, sid, attempt, parts, from, count, seq, first)
  local texts, spelt = {'['}, nil
  for i = 0, count - 1 do
    local k = from + 3 * i
    spelt = (i == 0 and first) or string.format('%d', seq + i)
    local json = parts[k + 1] .. spelt .. parts[k + 2]
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
  return texts, spelt
end
