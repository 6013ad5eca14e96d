-- _whole.lua: is a session's store whole? Not a script of its own: scripts.py puts it in
-- place of the line `-- include: _whole.lua` of a script whose KEYS 1-10 are one session's.
--
-- A Redis that evicts keys (a maxmemory-policy other than noeviction), or a hand that
-- deletes some, can leave a session half gone. Its own counters in `meta` say which keys
-- must exist: a stream keeps its key when trimmed empty (at rest the inbox goes and the
-- log moves to `rest`, or goes under the checkpoint), `msgs` is never emptied, the
-- checkpoint stands once one was stored (meta `through`), and the lease from the first
-- claim on. A session that fails this is refused
-- (FX_SESSION_INCOMPLETE), never run or answered from what is left.
--
-- lost_key(ui, inbox, head, epoch, rest, turn, through) -> nil, or the name of the first
--   key that is gone. ui, inbox, head: meta's counters (0 when unset); epoch: meta's epoch
--   (claims made); rest: meta's `rest` (a session at rest keeps its log in `rest`,
--   _rest.lua); turn: meta's `turn` (an open turn reads its input from the inbox);
--   through: meta's `through`, the stored checkpoint's (0: none, or one stored before
--   meta kept it: then the log is checked as before, against both keys)
-- orphan_key() -> with meta gone: nil when no other key of the session is left, 'meta'
--   when one is left that does not expire (a session lost its meta), else 'expired' (the
--   rest of a session set to expire, still on its way out)

local function lost_key(ui, inbox, head, epoch, rest, turn, through)
  if ui > 0 and redis.call('EXISTS', KEYS[5]) == 0 then return 'ui' end
  -- The inbox holds what waits and the open turn's input (consumed entries are read no
  -- more, and at rest it is gone; a parked turn at rest keeps its input in `rest`):
  -- needed while either is there.
  if inbox > 0 and redis.call('EXISTS', KEYS[3]) == 0
     and (((turn or '') ~= '' and not rest) or redis.call('ZCARD', KEYS[7]) > 0) then
    return 'inbox'
  end
  if inbox > 0 and redis.call('EXISTS', KEYS[6]) == 0 then return 'msgs' end
  -- Without its checkpoint the records after it would load as the whole conversation.
  if through > 0 and redis.call('EXISTS', KEYS[9]) == 0 then return 'ckpt' end
  if rest then
    if redis.call('EXISTS', KEYS[10]) == 0 then return 'rest' end
  elseif head > through and redis.call('EXISTS', KEYS[4]) == 0
         and (through > 0 or redis.call('EXISTS', KEYS[9]) == 0) then
    return 'log'
  end
  if (epoch > 0 or head > 0) and redis.call('EXISTS', KEYS[2]) == 0 then return 'lease' end
  return nil
end

local function orphan_key()
  local left = nil
  for i = 2, 10 do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      if redis.call('PTTL', KEYS[i]) == -1 then return 'meta' end
      left = 'expired'
    end
  end
  return left
end
