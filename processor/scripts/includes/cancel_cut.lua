-- cancel_cut: where a cancel cuts a turn (docs/design.md, "Cancellation"):
-- the turn's entries that a worker had read before a script first saw the
-- cancel key are merged, whoever applies them and whenever; the ones read
-- after are dropped. Recorded once in the turn's hash (`cut`), so every
-- worker and every later call agrees, as a bound that sorts like padded ids
-- (includes/pad_id): an entry is merged iff pad_id(id) < cut.
--
-- The bound is the group's last-delivered-id (pad_id(last) .. '+': every
-- entry delivered so far, which may still be in another worker's hands or a
-- dead worker's, is merged once applied), except when the cancel is first
-- seen while applying a batch read with XREADGROUP > (`read_from`, its first
-- id: that read and everything after it count as read after the cancel,
-- but for what is stored of the turn already: `stored_to`, its newest
-- stored entry, padded, or '' none (apply_entries' newest_stored); another
-- worker reading the same shard may have read and stored later entries of
-- the turn before this batch was applied, and those are merged, so
-- everything before them must be), and
-- pad_id('0-0') (nothing) for a turn that had not started. finalise_held
-- records a holder's own bound instead (what it has routed). Needs
-- includes/pad_id and includes/last_delivered.
--- includes/pad_id
--- includes/last_delivered
local function cancel_cut(tkey, updates, group, started, read_from, stored_to)
  local cut = redis.call('HGET', tkey, 'cut')
  if cut then return cut end
  if not started then
    cut = pad_id('0-0')
  elseif read_from and read_from ~= '' then
    cut = pad_id(read_from)
    if stored_to and stored_to ~= '' and stored_to >= cut then cut = stored_to .. '+' end
  else
    cut = pad_id(last_delivered(updates, group) or '0-0') .. '+'
  end
  redis.call('HSET', tkey, 'cut', cut)
  return cut
end
