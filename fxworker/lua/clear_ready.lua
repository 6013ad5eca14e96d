-- clear_ready.lua: remove a session from the ready set when its mark is old enough.
--
-- KEYS  1 ready (ZSET)  2 sessions (ZSET)      -- the {~index} slot
-- ARGV  1 session id   2 newest mark that may go (ms)   3 "1" also drop it from the index
-- Returns 1 when removed, 0 when kept (a newer mark may belong to an input still landing)
--
-- Invariant: a mark newer than the grace period is never removed, so a sender that marked
-- the session and whose accept.lua is still in flight keeps its wake-up. The caller checked
-- (state.lua, the session's slot) that nothing is pending before this call.

local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ARGV[3] == '1' then redis.call('ZREM', KEYS[2], ARGV[1]) end
if score and tonumber(score) <= tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
