-- _at_rest.lua: what a session gives back when its lease goes with nothing left to run.
-- Not a script of its own: scripts.py puts it in place of the line
-- `-- include: _at_rest.lua` of a script whose KEYS 1-10 are one session's and that
-- includes _rest.lua before it (release.lua, and append.lua when a turn's end record lets
-- the session go).
--
-- at_rest(ttl_ms, ready, session_id) -> the session leaves the ready set (`ready`: that
--   set's key on one server; nil on a cluster, where the set lives in another slot),
--   then gives back what its streams hold for appends to come: Redis allocates a
--   stream's node at 4 KiB and never shrinks it while it is the last one, and a stream
--   costs some 400 B even when small. The inbox's entries are all consumed: it goes (the
--   next accept adds entry `<seq>-0` to a new one). The log goes into `rest` (_rest.lua).
--   The lines are rewritten to their size while they are few (at most 32 entries and
--   16 KiB: a reader blocked on them waits on as before, for entries after its cursor);
--   a longer stream keeps its last node's allocation, a small part of it. The
--   idempotency keys go: every retry they could answer is of a call this release now
--   fences, and the next epoch's records carry keys of their own. With ttl_ms > 0 the ten keys get the retention TTL (meta `expiring`).

-- The rewrite gives back at most the 4 KiB node (3.7 KiB of a one-turn session's 4.7 KiB,
-- 1.4 KiB at 16 turns, 1 to 3 KiB of a 1,000-turn session's 265 KiB: bench/history_cost.py)
-- and writes the whole stream to the AOF and the replicas (RESTORE): only a small stream is
-- rewritten, so a release costs the same at any length.
local AT_REST_REWRITE_MAX_ENTRIES = 32
local AT_REST_REWRITE_MAX_BYTES = 16384

-- A small stream rewritten to its size (the key keeps no TTL: callers set it after).
local function shrink(key)
  if redis.call('XLEN', key) <= AT_REST_REWRITE_MAX_ENTRIES then
    local dumped = redis.call('DUMP', key)
    if dumped and #dumped <= AT_REST_REWRITE_MAX_BYTES then
      redis.call('RESTORE', key, 0, dumped, 'REPLACE')
    end
  end
end

local function at_rest(ttl_ms, ready, session_id)
  if ready then redis.call('ZREM', ready, session_id) end
  redis.call('DEL', KEYS[8])
  redis.call('HDEL', KEYS[1], 'line_key')
  rest_pack()
  shrink(KEYS[5])
  if ttl_ms > 0 then
    for k = 1, 10 do redis.call('PEXPIRE', KEYS[k], ttl_ms) end
    redis.call('HSET', KEYS[1], 'expiring', 1)  -- accept.lua persists them again
  end
end

-- parked(ready, session_id, turn_seq, input_at_rest) -> a parked turn's session gives back
--   the same, but for what its turn and the inputs behind it still need: its log goes into
--   `rest`, and, given input_at_rest, its input too when nothing waits behind it (the inbox
--   goes); else the inbox keeps
--   the input and what waits (the consumed entries before the input go) and is
--   rewritten to its size, as the lines are; no retention TTL (the turn is open).
local function parked(ready, session_id, turn_seq, input_at_rest)
  if ready then redis.call('ZREM', ready, session_id) end
  redis.call('DEL', KEYS[8])
  redis.call('HDEL', KEYS[1], 'line_key')
  if input_at_rest and turn_seq > 0 and redis.call('ZCARD', KEYS[7]) == 0 then
    rest_log(turn_seq)
  else
    rest_log()
    if turn_seq > 1 then redis.call('XTRIM', KEYS[3], 'MINID', turn_seq .. '-0') end
    shrink(KEYS[3])
  end
  shrink(KEYS[5])
end
