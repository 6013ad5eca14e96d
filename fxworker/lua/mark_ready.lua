-- mark_ready.lua: put a session in the ready set (and the session index).
--
-- KEYS  1 ready (ZSET)  2 sessions (ZSET)      -- the {~index} slot, never a session's
-- ARGV  1 session id   2 now_ms
-- Returns 1
--
-- Invariant: runs *before* accept.lua, so a sender that dies after its input was
-- acknowledged leaves the session in the ready set for the sweeper. (On a standalone
-- server accept.lua makes the same two writes itself, first: one call.) The score is the
-- time of the newest mark; clear_ready.lua removes only marks older than its grace period.

-- GT adds a new member and moves an existing one only forward in time.
redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1])
return 1
