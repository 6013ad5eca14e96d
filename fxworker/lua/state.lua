-- state.lua: a consistent snapshot of one session (read only).
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3 inbox  4 log  5 ui  6 msgs  7 pending (ZSET)
--       8 keys  9 ckpt                                                     -- one session, one slot
-- ARGV  (none)
-- Returns {} for no such session, else {agent, created_ms, ui_cursor, turns, turn,
--          last_turn, pending_count, cancel_target, lease_holder, lease_epoch,
--          lease_expires_ms, lease_state, head, yielded}
--
-- Invariant: reads every field in one atomic step, so status (idle / waiting / running)
-- is derived from one moment of the session, never from two.

local m = redis.call('HMGET', KEYS[1], 'agent', 'created_ms', 'ui', 'turns', 'turn', 'last_turn', 'cancel', 'head', 'yielded')
if not m[1] then return {} end
local l = redis.call('HMGET', KEYS[2], 'holder', 'epoch', 'expires_ms', 'state')
return {m[1], tonumber(m[2] or 0), tonumber(m[3] or 0), tonumber(m[4] or 0), m[5] or '', m[6] or '',
        redis.call('ZCARD', KEYS[7]), m[7] or '', l[1] or '', tonumber(l[2] or 0), tonumber(l[3] or 0),
        l[4] or '', tonumber(m[8] or 0), tonumber(m[9] or 0)}
