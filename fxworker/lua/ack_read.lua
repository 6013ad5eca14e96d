-- ack_read.lua: a write that follows a read of a session's lines, so that a WAIT (or
-- WAITAOF) sent after it on the same connection covers every line the read returned.
--
-- KEYS  1 meta (HASH)
-- ARGV  1 the cursor the read was after
-- Returns meta's `ui` (the session's last UI cursor), or false when it has none
--
-- Invariant: it changes nothing: meta's `ui` is written back as it was. Redis replicates
-- the write after every line stored before it, so once a replica acknowledges it, the
-- replica holds what the read returned. Nothing is written when no line follows the
-- cursor (a follower's read that timed out: nothing to vouch for). The HDEL comes first:
-- a script's first write may not be one that grows memory when Redis is at its limit, and
-- a reader must go on reading then.

local ui = redis.call('HGET', KEYS[1], 'ui')
if ui and tonumber(ui) > tonumber(ARGV[1]) then
  redis.call('HDEL', KEYS[1], 'ui')
  redis.call('HSET', KEYS[1], 'ui', ui)
end
return ui
