--[==[
cancel_turn: cancel a turn (docs/contract.md §6): set its cancellation key,
bounded, with a TTL, never shortening or deleting a cancel already there.
Runs as the Redis Function cancel_turn_<version> of library
processor_<version> (processor/scripts/library.py), FCALLed by
Producer.cancel, `processor cancel` and `processor serve`, or with EVALSHA
on a Redis without functions (before 7.0).

A function runs its commands with its caller's rights, and an ACL cannot
bound SET's value or make it keep a TTL: so the least-privilege ACL users
(`serve`, `producer`, `producer-trusted`) may not SET cancel keys at all.
For such a caller this function publishes the request on the namespace's
cancel channel instead, and every worker that takes it calls this same
function with its own rights, which do include SET
(processor/worker/cancel_requests.py); the caller then waits until the key
exists. A caller that may SET (a worker, an administrator, a Redis without
ACL users) sets the key here:

- no key: SET <reason> with the TTL asked;
- a key: its value stays (the first reason wins), and its TTL becomes the
  longer of the two (a key without TTL, an administrator's, keeps none).

KEYS[1] the turn's cancellation key ({ns:s}:cancel:<response_id>; the id 1 to
        512 characters, docs/contract.md §3.2, as processor/wire/ids.py's
        MAX_ID_LENGTH: a key is never a way to store more)

ARGV[1] reason (1 to 1024 bytes)   ARGV[2] TTL in seconds (1 to 86400)
ARGV[3] the namespace's cancel channel ({ns:0}:cancels); '' = never ask
        (a worker carrying out a request: it must set the key itself)

Returns { 'set' | 'kept', the key's TTL now in ms (-1: none) }, or
{ 'asked', the number of clients the request reached on this node } (a
worker sets the key; the caller waits for it: processor/client/producer.py).
Errors: CANCELARG (a reason, TTL or key out of bounds; nothing changed),
CANCELNOPERM (this caller may not set the key and ARGV[3] is '').
]==]

local key, reason, channel = KEYS[1], ARGV[1], ARGV[3]
local ttl = tonumber(ARGV[2])
local at = string.find(key, '}:cancel:', 1, true)
if not at then
  return redis.error_reply('CANCELARG not a cancellation key')
end
local id_bytes = #key - (at + 8)
-- Refused before it is copied or counted: more than 4 bytes per character
-- cannot be 512 UTF-8 characters, and counting megabytes blocks Redis.
if id_bytes > 512 * 4 then
  return redis.error_reply('CANCELARG a cancelled turn\'s id is 1 to 512 characters, not '
                           .. id_bytes .. ' bytes')
end
local id = string.sub(key, at + 9)
local chars = select(2, string.gsub(id, '[^\128-\191]', ''))  -- (UTF-8 characters)
if chars < 1 or chars > 512 then
  return redis.error_reply('CANCELARG a cancelled turn\'s id is 1 to 512 characters, not ' .. chars)
end
if #reason < 1 or #reason > 1024 then
  return redis.error_reply('CANCELARG a cancel reason is 1 to 1024 bytes, not ' .. #reason)
end
if not ttl or ttl ~= math.floor(ttl) or ttl < 1 or ttl > 86400 then
  return redis.error_reply('CANCELARG a cancel TTL is 1 to 86400 seconds, not ' .. ARGV[2])
end
local ms = ttl * 1000

local left = redis.call('PTTL', key)
local may_set = true
if redis.acl_check_cmd then  -- (Redis 7.0+; before, no ACL users run this)
  may_set = redis.acl_check_cmd('SET', key, reason, 'PX', ms, 'NX')
    and redis.acl_check_cmd('PEXPIRE', key, ms)
end
if not may_set then
  if left == -1 or left >= ms then return { 'kept', left } end  -- nothing to ask
  if channel == '' then
    return redis.error_reply('CANCELNOPERM this user may not set cancellation keys')
  end
  local request = cjson.encode({ key, reason, ttl })
  return { 'asked', redis.call('PUBLISH', channel, request) }
end
if left == -2 then
  redis.call('SET', key, reason, 'PX', ms)
  return { 'set', ms }
end
if left ~= -1 and left < ms then
  redis.call('PEXPIRE', key, ms)
  left = ms
end
return { 'kept', left }
