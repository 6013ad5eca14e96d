-- accept.lua: store one prompt or steer in a session's inbox, once per message id.
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3 inbox (STREAM)  4 log (STREAM)  5 ui (STREAM)
--       6 msgs (HASH)  7 pending (ZSET)  8 keys (HASH)  9 ckpt (HASH)      -- one session, one slot
-- ARGV  1 kind ("p" prompt | "s" steer)   2 message id   3 input (JSON text)
--       4 context (JSON text or "")   5 settings (JSON text or "")   6 agent name
--       7 now_ms   8 create ("1" creates the session on first input, "0" refuses)
--       9 steer max bytes   10 steer max queued count   11 steer max queued bytes
-- Returns {"ok", agent, state, seq, end_cursor, ui_cursor, created(0|1)}
--         {"repeated", agent, state, seq, end_cursor, ui_cursor, 0}
--         {"in_use", stored_kind} | {"unknown"} | {"too_large", limit} | {"queue_full", what, limit}
--
-- Invariant: a message id names one input. The same id and kind again stores nothing and
-- reports the original (state w waiting | r its turn is open | d done); the same id with
-- the other kind is refused. Steer limits hold for the queued (unconsumed) steers.
-- The caller marked the session ready *before* this call (mark_ready.lua, another slot).

local meta, inbox, msgs, pending = KEYS[1], KEYS[3], KEYS[6], KEYS[7]
local kind, mid, input, context, settings, agent = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local now_ms = ARGV[7]

local stored = redis.call('HGET', msgs, mid)
if stored then
  local k, state, seq, endc = string.match(stored, '^(%a):(%a):(%d+):(%d+)')
  if k ~= kind then return {'in_use', k} end
  local m = redis.call('HMGET', meta, 'agent', 'ui')
  return {'repeated', m[1] or '', state, tonumber(seq), tonumber(endc), tonumber(m[2] or 0), 0}
end

local m = redis.call('HMGET', meta, 'agent', 'ui', 'inbox', 'steers', 'steer_bytes', 'expiring')
local owner = m[1]
local seq = tonumber(m[3] or 0) + 1
local size = string.len(input)
local fields = {'inbox', seq}
if not owner then
  if ARGV[8] ~= '1' then return {'unknown'} end
  owner = agent
  fields[3], fields[4], fields[5], fields[6] = 'agent', agent, 'created_ms', now_ms
end
if kind == 's' then
  local steers, bytes = tonumber(m[4] or 0) + 1, tonumber(m[5] or 0) + size
  if size > tonumber(ARGV[9]) then return {'too_large', tonumber(ARGV[9])} end
  if steers > tonumber(ARGV[10]) then return {'queue_full', 'count', tonumber(ARGV[10])} end
  if bytes > tonumber(ARGV[11]) then return {'queue_full', 'bytes', tonumber(ARGV[11])} end
  fields[#fields + 1], fields[#fields + 2], fields[#fields + 3], fields[#fields + 4] = 'steers', steers, 'steer_bytes', bytes
end
if m[6] == '1' then
  -- New input revives a finished session that was set to expire.
  for i = 1, #KEYS do redis.call('PERSIST', KEYS[i]) end
  fields[#fields + 1], fields[#fields + 2] = 'expiring', 0
end

redis.call('HSET', meta, unpack(fields))
redis.call('XADD', inbox, seq .. '-0', 'k', kind, 'id', mid, 'in', input, 'cx', context, 'st', settings, 'at', now_ms)
redis.call('HSET', msgs, mid, kind .. ':w:' .. seq .. ':0:' .. size)
redis.call('ZADD', pending, seq, mid)
return {'ok', owner, 'w', seq, 0, tonumber(m[2] or 0), m[1] and 0 or 1}
