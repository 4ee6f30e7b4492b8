--[==[
send_update: a producer's XADD with an idempotency key, so that a retried
send (a timeout after Redis applied it) does not add the entry twice, and
refused for a turn that has ended (turn ids are single-use while the turn's
done marker lives, the workers' --done-ttl). Always XADD '*': the id is
Redis's. Runs as the Redis Function send_update_<version> of library
processor_<version> (processor/scripts/library.py says how it is versioned;
producers FCALL it and may load no Lua of their own), or with EVALSHA on a
Redis without functions (before 7.0).

KEYS[1] updates stream   KEYS[2] idempotency key   KEYS[3] the turn's done marker

ARGV[1] idempotency TTL (seconds)
ARGV[2..] the entry's field/value pairs

Returns the entry id (the first send's id when the key was already used).
Error TURNENDED <status>: the turn ended (completed, error, ...) and nothing
was added. A cancelled turn takes entries still: the worker drops and
counts them (docs/contract.md §6).
]==]

--- includes/send_guard

local refused = send_guard(KEYS[2], KEYS[3])
if refused then return refused end
local fields = {}
for i = 2, #ARGV do fields[i - 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
redis.call('SET', KEYS[2], id, 'EX', ARGV[1])
return id
