-- load.lua: what a claim would load, read without a lease (read only).
--
-- KEYS  1 meta (HASH)  2 lease  3 inbox  4 log (STREAM)  5 ui  6 msgs  7 pending
--       8 keys  9 ckpt (HASH)  10 rest                                     -- one session, one slot
-- ARGV  (none)
-- Returns {} for no such session, else {agent, ckpt_data, ckpt_through, log entries, rest}
--   log entries: XRANGE's reply; rest: the session's `rest` value or false (_rest.lua).
--
-- Invariant: one atomic read. A session at rest keeps its log in `rest` and the next claim
-- puts it back into the stream; read in two steps, a claim in between would hide it from
-- both.

local agent = redis.call('HGET', KEYS[1], 'agent')
if not agent then return {} end
local c = redis.call('HMGET', KEYS[9], 'data', 'through')
return {agent, c[1] or false, c[2] or false, redis.call('XRANGE', KEYS[4], '-', '+'), redis.call('GET', KEYS[10])}
