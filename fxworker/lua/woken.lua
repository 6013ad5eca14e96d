-- woken.lua: note that a wake of the session is about to be queued (the sweeper's, a
-- delivery's after a yield or with inputs left, a cancel's, a passed-on one).
--
-- KEYS  1 meta (HASH)                                                       -- one session
-- ARGV  1 now_ms   2 trust_ms ("0" or absent: note it whatever is outstanding)
-- Returns 1 when noted (send the wake), 0 for no such session (nothing is created) or
-- when a wake noted less than trust_ms ago is still outstanding (it runs what this one
-- would: send none).
--
-- Invariant: meta `woken` names the newest wake queued and not yet taken; the next claim
-- of the session takes it (claim.lua). With trust_ms, at most one wake of the session is
-- outstanding from any sender; the sweeper passes 0 once it has evidence the outstanding
-- one was lost (fxworker/sweeper.py).

if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local trust_ms = tonumber(ARGV[2] or '0') or 0
if trust_ms > 0 then
  local woken = tonumber(redis.call('HGET', KEYS[1], 'woken') or '')
  if woken and tonumber(ARGV[1]) - woken < trust_ms then return 0 end
end
redis.call('HSET', KEYS[1], 'woken', ARGV[1])
return 1
