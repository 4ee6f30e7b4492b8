--[==[
read_inputs: the input entries of one shard after a position, for
`processor capture`, with what tells whether any entry after that position
was deleted before it could be read (workers trim what they applied). One
script, so that the entries and the stream's deletion mark are one snapshot.
It reads only: no consumer group, nothing acked, nothing changed.

KEYS[1] updates stream
KEYS[2] optional: the cancellation key of the followed turn (same hash tag)

ARGV[1] read after this entry id; "$": after the last entry ever added
ARGV[2] at most this many entries (0: none, only resolve the position)

Returns {position, entries, max_deleted, cancelled}: the id read after (ARGV[1],
or "$" resolved: "0-0" without a stream), the XRANGE reply, the stream's
max-deleted-entry-id ("" on Redis before 7.0, or without a stream), and 1 when
KEYS[2] exists (else 0).
]==]

local stream, after, count = KEYS[1], ARGV[1], tonumber(ARGV[2])

local info = {}
local reply = redis.pcall('XINFO', 'STREAM', stream)
if type(reply) == 'table' and not reply.err then
  for i = 1, #reply - 1, 2 do info[reply[i]] = reply[i + 1] end
end

if after == '$' then
  after = info['last-generated-id'] or '0-0'
end
local entries = {}
if info['length'] and count > 0 then
  entries = redis.call('XRANGE', stream, '(' .. after, '+', 'COUNT', count)
end
local cancelled = 0
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
  cancelled = 1
end
return {after, entries, info['max-deleted-entry-id'] or '', cancelled}
