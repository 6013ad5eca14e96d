-- save_checkpoint.lua: store a checkpoint and trim what it covers (compaction).
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3 inbox (STREAM)  4 log (STREAM)  5 ui
--       6 msgs  7 pending (ZSET)  8 keys (HASH)  9 ckpt (HASH)  10 rest      -- one session, one slot
-- ARGV  1 epoch   2 now_ms   3 through (log cursor covered, "0" none)   4 data
--       5 max bytes   6 ttl_ms ("0" keeps finished sessions)
-- Returns {"ok", records_trimmed, log_length}
--         {"fenced", lease_epoch, lease_state, lease_expires_ms}
--         {"bad_through", head, previous_through} | {"too_large", max_bytes}
--
-- Invariant: a claim after this reads the same conversation as before it (checkpoint +
-- the records after `through`), with a log no longer than the records since `through`.
-- Only the chain head checkpoints, and never backwards (through >= the stored through).
-- Inbox entries go only once consumed and older than every input still waiting or open.

local meta, lease, inbox, log, pending, keys, ckpt = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7], KEYS[8], KEYS[9]
local epoch, now_ms, through, ttl_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[6])
local l = redis.call('HMGET', lease, 'epoch', 'state', 'expires_ms')
if tonumber(l[1] or 0) ~= epoch or l[2] ~= 'held' or tonumber(l[3] or 0) <= now_ms then
  return {'fenced', tonumber(l[1] or 0), l[2] or '', tonumber(l[3] or 0)}
end
if string.len(ARGV[4]) > tonumber(ARGV[5]) then return {'too_large', tonumber(ARGV[5])} end
local m = redis.call('HMGET', meta, 'head', 'turn', 'turn_seq', 'inbox')
local head = tonumber(m[1] or 0)
local previous = tonumber(redis.call('HGET', ckpt, 'through') or 0)
if through > head or through < previous then return {'bad_through', head, previous} end

redis.call('HSET', ckpt, 'data', ARGV[4], 'through', through)
redis.call('HSET', meta, 'through', through)  -- the key must exist from now on (_whole.lua)
local trimmed = 0
if through > 0 then
  for _, e in ipairs(redis.call('XRANGE', log, '-', through .. '-0')) do
    local f = e[2]
    for i = 1, #f, 2 do if f[i] == 'k' then redis.call('HDEL', keys, f[i + 1]) end end
    trimmed = trimmed + 1
  end
  redis.call('XTRIM', log, 'MINID', (through + 1) .. '-0')
  -- The newest line-only call key (append.lua) goes too once a later record is covered:
  -- its writer no longer retries it. One written after record `through` may still be.
  local line_key = redis.call('HGET', meta, 'line_key')
  if line_key then
    local v = redis.call('HGET', keys, line_key)
    if not v or tonumber(string.match(v, '^(%d+)')) < through then
      redis.call('HDEL', keys, line_key)
      redis.call('HDEL', meta, 'line_key')
    end
  end
end

-- Keep inbox entries from the oldest one still needed (waiting, or the open turn's).
local keep = tonumber(m[4] or 0) + 1
local oldest = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
if #oldest > 0 and tonumber(oldest[2]) < keep then keep = tonumber(oldest[2]) end
local turn_seq = tonumber(m[3] or 0)
if (m[2] or '') ~= '' and turn_seq > 0 and turn_seq < keep then keep = turn_seq end
redis.call('XTRIM', inbox, 'MINID', keep .. '-0')

if ttl_ms > 0 and (m[2] or '') == '' and redis.call('ZCARD', pending) == 0 then
  for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ttl_ms) end
  redis.call('HSET', meta, 'expiring', 1)  -- accept.lua persists them again
end
return {'ok', trimmed, redis.call('XLEN', log)}
