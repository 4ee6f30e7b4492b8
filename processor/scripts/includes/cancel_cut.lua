-- cancel_cut: where a cancel cuts a turn (docs/design.md, "Cancellation"):
-- the turn's entries that a worker had read before a script first saw the
-- cancel key are merged, whoever applies them and whenever; the ones read
-- after are dropped. Recorded once in the turn's hash (`cut`), so every
-- worker and every later call agrees, as a bound that sorts like padded ids
-- (includes/pad_id): an entry is merged iff pad_id(id) < cut.
--
-- The bound is the group's last-delivered-id (pad_id(last) .. '+': every
-- entry delivered so far, which may still be in another worker's hands or a
-- dead worker's, is merged once applied), except where the calling worker
-- has read entries it has not taken in yet (`read_from`: the first id of
-- the XREADGROUP > read apply_entries is applying, or of the read a sweep's
-- worker has read ahead of its applier): that read and everything after it
-- count as read after the cancel, but for what is stored of the turn
-- already (`stored_to`, newest_stored's; another worker reading the same
-- shard may have read and stored later entries of the turn before this
-- read was applied, and those are merged, so everything before them must
-- be). pad_id('0-0') (nothing) for a turn that had not started.
-- finalise_held records a holder's own bound instead (what it has
-- routed). Needs includes/pad_id and includes/last_delivered.
--- includes/pad_id
--- includes/last_delivered

-- newest_stored: the newest entry of a turn stored so far (padded; ''
-- none): the newest record in its recs hash, or the cover of its snapshot
-- (a compaction's or a checkpoint's). Read only where a cancel first cuts
-- a turn (a field kept up to date would cost every store).
local function newest_stored(tkey, rkey)
  local cover = redis.call('HGET', tkey, 'cover')
  local newest = cover and pad_id(cover) or ''
  for _, field in ipairs(redis.call('HKEYS', rkey)) do
    if field ~= 'state' then
      local padded = pad_id(field)
      if padded > newest then newest = padded end
    end
  end
  return newest
end

-- record_cut: record the cut of a turn that has none yet (the caller
-- looked), and return it. stored_to: newest_stored's, if the caller has it
-- (else read when needed).
local function record_cut(tkey, rkey, updates, group, started, read_from, stored_to)
  local cut
  if not started then
    cut = pad_id('0-0')
  elseif read_from and read_from ~= '' then
    cut = pad_id(read_from)
    stored_to = stored_to or newest_stored(tkey, rkey)
    if stored_to >= cut then cut = stored_to .. '+' end
  else
    cut = pad_id(last_delivered(updates, group) or '0-0') .. '+'
  end
  redis.call('HSET', tkey, 'cut', cut)
  return cut
end

-- cancel_cut: the turn's cut, recorded now if it has none.
local function cancel_cut(tkey, rkey, updates, group, started, read_from)
  return redis.call('HGET', tkey, 'cut') or record_cut(tkey, rkey, updates, group, started,
                                                       read_from)
end
