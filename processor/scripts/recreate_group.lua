--[==[
recreate_group: put back a shard's consumer group that vanished under a
running worker (XGROUP DESTROY, the stream deleted), without replaying what
was delivered and without losing what this worker had pending.

Atomically: create the group at `last` (the newest entry this worker knows
was delivered in it, "0" when it knows none) if it is missing (with the
stream, if that is missing too); if it exists (another worker recreated it
first) raise its last delivered id to `last` when below, never lower it;
then make every entry of `ids` (those this worker held or had read and not
yet applied) pending to this consumer again (XCLAIM ... FORCE JUSTID: the
fences and the watermark work on them as before). Entries deleted from the
stream meanwhile are not claimed.

KEYS[1] updates stream

ARGV[1] consumer group   ARGV[2] last delivered id ("0": none known)
ARGV[3] this consumer    ARGV[4..] the entry ids to make pending to it

Returns { "created" | "raised" | "kept", the group's last delivered id, ids claimed }
]==]

--- includes/pad_id

local updates, group, last, consumer = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local status, delivered = 'created', last
local groups = redis.pcall('XINFO', 'GROUPS', updates)
local found
if type(groups) == 'table' and not groups.err then
  for _, info in ipairs(groups) do
    local name, id
    for j = 1, #info, 2 do
      if info[j] == 'name' then name = info[j + 1] end
      if info[j] == 'last-delivered-id' then id = info[j + 1] end
    end
    if name == group then found = id end
  end
end
if not found then
  redis.call('XGROUP', 'CREATE', updates, group, last, 'MKSTREAM')
elseif last ~= '0' and pad_id(found) < pad_id(last) then
  redis.call('XGROUP', 'SETID', updates, group, last)
  status = 'raised'
else
  status, delivered = 'kept', found
end
local claimed = 0
for j = 4, #ARGV, 1000 do
  local args = { updates, group, consumer, 0 }
  for i = j, math.min(j + 999, #ARGV) do args[#args + 1] = ARGV[i] end
  args[#args + 1] = 'FORCE'
  args[#args + 1] = 'JUSTID'
  claimed = claimed + #redis.call('XCLAIM', unpack(args))
end
return { status, delivered, claimed }
