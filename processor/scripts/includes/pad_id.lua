-- pad_id: "ms-seq" -> fixed-width text that sorts like the stream id
-- (zset lex order), without going through Lua's double-precision numbers.
local function pad_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return string.rep('0', 20 - #ms) .. ms .. '-' .. string.rep('0', 20 - #seq) .. seq
end
