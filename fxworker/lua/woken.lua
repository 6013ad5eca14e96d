-- woken.lua: note that a wake of the session was just queued (the sweeper's, a yield's).
--
-- KEYS  1 meta (HASH)                                                       -- one session
-- ARGV  1 now_ms
-- Returns 1 when noted, 0 for no such session (nothing is created).
--
-- Invariant: meta `woken` names the newest wake queued and not yet taken; the next claim
-- of the session takes it (claim.lua). The sweeper queues no wake for a session whose
-- wake is outstanding, unless it has evidence the wake was lost (fxworker/sweeper.py).

if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'woken', ARGV[1])
return 1
