-- renew.lua: extend the lease of the worker that heads the epoch chain.
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3-9 the session's other keys (unused; one slot)
-- ARGV  1 epoch   2 lease_ms   3 now_ms
-- Returns {"ok", expires_ms} | {"fenced", lease_epoch, lease_state, lease_expires_ms}
--
-- Invariant: a lease that was released, expired by now_ms or claimed again (new epoch) is
-- never brought back: the renewal is refused and its worker must stop.

local lease = KEYS[2]
local epoch, lease_ms, now_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local l = redis.call('HMGET', lease, 'epoch', 'state', 'expires_ms')
if tonumber(l[1] or 0) ~= epoch or l[2] ~= 'held' or tonumber(l[3] or 0) <= now_ms then
  return {'fenced', tonumber(l[1] or 0), l[2] or '', tonumber(l[3] or 0)}
end
local expires = now_ms + lease_ms
redis.call('HSET', lease, 'expires_ms', string.format('%d', expires))
return {'ok', expires}
