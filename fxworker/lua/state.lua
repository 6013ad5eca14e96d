-- state.lua: a consistent snapshot of one session (read only).
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3 inbox  4 log  5 ui  6 msgs  7 pending (ZSET)
--       8 keys  9 ckpt  10 rest                                            -- one session, one slot
-- ARGV  (none)
-- Returns {} for no such session (or one set to expire that lost a key: expiring),
--         {"incomplete", key} for one with a key gone (_whole.lua), else
--         {"ok", agent, created_ms, ui_cursor, turns, turn, last_turn, pending_count,
--          cancel_target, lease_holder, lease_epoch, lease_expires_ms, lease_state, head,
--          yielded, unserved_ms, unserved_next_ms, woken_ms, newer, paused, decisions}
--   lease_epoch: the larger of the lease's and meta's epoch; unserved_*: 0 unless a wake
--   found no process running the session's agent (claim.lua) since its last claim;
--   woken_ms: when the outstanding wake was queued (0: none; claim.lua takes it);
--   newer: the layout level a claim must read (0: any; release.lua, claim.lua);
--   paused: the calls the open turn waits on for a decision, `\n`-separated ("" none;
--   append.lua's `pause` mark); decisions: decisions accepted and not yet taken by a turn.
--
-- Invariant: reads every field in one atomic step, so status (idle / waiting / running)
-- is derived from one moment of the session, never from two.

-- include: _whole.lua

local m = redis.call('HMGET', KEYS[1], 'agent', 'created_ms', 'ui', 'turns', 'turn', 'last_turn', 'cancel', 'head', 'yielded',
                     'inbox', 'epoch', 'expiring', 'unserved_ms', 'unserved_next_ms', 'rest',
                     'through', 'woken', 'newer', 'paused', 'decisions')
if not m[1] then
  if orphan_key() == 'meta' then return {'incomplete', 'meta'} end
  return {}
end
local lost = lost_key(tonumber(m[3] or 0), tonumber(m[10] or 0), tonumber(m[8] or 0), tonumber(m[11] or 0),
                      m[15], m[5], tonumber(m[16] or 0))
if lost then
  if m[12] == '1' then return {} end
  return {'incomplete', lost}
end
local l = redis.call('HMGET', KEYS[2], 'holder', 'epoch', 'expires_ms', 'state')
return {'ok', m[1], tonumber(m[2] or 0), tonumber(m[3] or 0), tonumber(m[4] or 0), m[5] or '', m[6] or '',
        redis.call('ZCARD', KEYS[7]), m[7] or '', l[1] or '', math.max(tonumber(l[2] or 0), tonumber(m[11] or 0)),
        tonumber(l[3] or 0), l[4] or '', tonumber(m[8] or 0), tonumber(m[9] or 0), tonumber(m[13] or 0),
        tonumber(m[14] or 0), tonumber(m[17] or 0), tonumber(m[18] or 0),
        m[19] or '', tonumber(m[20] or 0)}
