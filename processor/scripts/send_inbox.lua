--[==[
send_inbox: a least-privilege producer's send. Like send_update (the same
idempotency key and TURNENDED refusal, includes/send_guard), but the entry
goes to the shard's inbox list, not to its updates stream: the producer
needs no XADD right, so it can neither choose an entry id nor trim the
stream (docs/security.md). A worker moves the inbox into the stream in
order (admit_inbox), where the entry gets its id. The fields travel as one
msgpack array of names and values; the bell gets a token unless it has one,
and the worker admitting the shard waits on it (BLPOP), so the entry is
admitted at once. Runs as the Redis Function send_inbox_<version>
(processor/scripts/library.py), or with EVALSHA on a Redis without functions.

KEYS[1] inbox list   KEYS[2] inbox bell   KEYS[3] idempotency key
KEYS[4] the turn's done marker

ARGV[1] idempotency TTL (seconds)
ARGV[2..] the entry's field/value pairs

Returns a receipt (the first send's when the key was already used): the
stream id "<ms>-0" for Redis's clock at the push less 1 ms, below any id
the entry, or its turn's outputs, can get once admitted, so it serves as
Subscriber.wait_for's `since`. Error TURNENDED <status>: the turn ended and
nothing was added.
]==]

--- includes/send_guard

local refused = send_guard(KEYS[3], KEYS[4])
if refused then return refused end
local fields = {}
for i = 2, #ARGV do fields[i - 1] = ARGV[i] end
redis.call('RPUSH', KEYS[1], cmsgpack.pack(fields))
if redis.call('LLEN', KEYS[2]) == 0 then redis.call('RPUSH', KEYS[2], '1') end
local now = redis.call('TIME')
local receipt = string.format('%d-0', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - 1)
redis.call('SET', KEYS[3], receipt, 'EX', ARGV[1])
return receipt
