-- send_guard: what a producer's send checks first, in the same call. An
-- idempotency key already used gives the first send's reply (a retried send
-- adds nothing); a turn whose done marker says it ended other than cancelled
-- is refused with TURNENDED <status> (turn ids are single-use while the
-- marker lives, the workers' --done-ttl; a cancelled turn takes entries
-- still: the worker drops and counts them, docs/contract.md §6). Returns the
-- reply to give instead of sending, or nil to send.
local function send_guard(idem, done)
  local existing = redis.call('GET', idem)
  if existing then return existing end
  local status = redis.call('HGET', done, 'status')
  if status and status ~= 'cancelled' then
    return redis.error_reply('TURNENDED ' .. status)
  end
  return nil
end
