--[==[
admit_inbox: move a shard's inbox (send_inbox's list) into its updates
stream, in order, as a worker admitting the shard (processor/worker/inbox.py). Per
item, from the head: XADD '*' the producer's fields, then LPOP it, so an
entry is never in both places or in neither (a failed XADD, e.g. out of
memory or a stream whose ids are exhausted, stops the call and leaves the
item first in line). Order within the shard is the inbox's order.

A producer allowed RPUSH on the inbox can push anything: an item that is
not one msgpack array of an even number (2 to 2000) of strings goes to the
DLQ whole, as the field `inbox_item`, with the reason ARGV[3] and a detail
saying what is wrong with it; never into the stream, never dropped.
Fields that are well-formed but not an entry a worker can merge (no turn
id, bad JSON, too large) are admitted as they are, and the worker reading
them dead-letters them with the usual reason.

Once the inbox is empty the bell goes (a flood of tokens pushed by a
producer costs one wake-up, not one per token); send_inbox rings it again
for the next entry.

KEYS[1] inbox list   KEYS[2] inbox bell   KEYS[3] updates stream   KEYS[4] dlq stream

ARGV[1] items to move at most   ARGV[2] bytes to move at most (at least one item)
ARGV[3] DLQ reason for a malformed item   ARGV[4] DLQ approximate MAXLEN

Returns {admitted, dead-lettered, items left in the inbox, error ('' or the
error of the XADD that stopped the call)}.
]==]

local inbox, bell, updates, dlq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local most, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local reason, dlq_max = ARGV[3], ARGV[4]
local MAX_FIELDS = 2000 -- names and values: what one XADD may unpack

-- The item's value when it is exactly one msgpack value, else nil and why.
local function one_value(ok, ...)
  local n = select('#', ...)
  if not ok then return nil, 'not msgpack: ' .. tostring((...)) end
  if n ~= 1 then return nil, n .. ' msgpack values, not one' end
  return (...)
end

-- The item's fields (names and values), else nil and why not.
local function entry_fields(item)
  local value, why = one_value(pcall(cmsgpack.unpack, item))
  if why then return nil, why end
  if type(value) ~= 'table' then return nil, 'a msgpack ' .. type(value) .. ', not an array' end
  local n = #value
  if n > MAX_FIELDS then return nil, 'more than ' .. MAX_FIELDS .. ' names and values' end
  local count = 0
  for _ in pairs(value) do
    count = count + 1
    if count > n then return nil, 'a msgpack map or an array with nils, not an array of strings' end
  end
  if n == 0 or n % 2 == 1 then return nil, n .. ' names and values, not an even number' end
  for i = 1, n do
    if type(value[i]) ~= 'string' then
      return nil, 'item ' .. i .. ' is a msgpack ' .. type(value[i]) .. ', not a string'
    end
  end
  return value
end

local admitted, dead, bytes, failed = 0, 0, 0, ''
while admitted + dead < most and bytes < budget do
  local item = redis.call('LINDEX', inbox, 0)
  if not item then break end
  local fields, why = entry_fields(item)
  local reply
  if fields then
    reply = redis.pcall('XADD', updates, '*', unpack(fields))
  else
    reply = redis.pcall('XADD', dlq, 'MAXLEN', '~', dlq_max, '*', 'inbox_item', item,
      'reason', reason, 'detail', 'inbox item (' .. #item .. ' bytes) refused: ' .. why,
      'source_id', '', 'deliveries', '0')
  end
  if type(reply) == 'table' and reply.err then
    failed = reply.err
    break
  end
  redis.call('LPOP', inbox)
  bytes = bytes + #item
  if fields then admitted = admitted + 1 else dead = dead + 1 end
end
local left = redis.call('LLEN', inbox)
if left == 0 then redis.call('DEL', bell) end
return { admitted, dead, left, failed }
