-- accept.lua: store one prompt, steer or decision in a session's inbox, once per message id.
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3 inbox (STREAM)  4 log (STREAM)  5 ui (STREAM)
--       6 msgs (HASH)  7 pending (ZSET)  8 keys (HASH)  9 ckpt (HASH)  10 rest -- one session, one slot
--       11 ready (ZSET)  12 sessions (ZSET)   -- optional: standalone Redis only ({~index} slot)
-- ARGV  1 kind ("p" prompt | "s" steer | "d" decision)   2 message id   3 input (JSON text)   4 agent name
--       5 now_ms   6 create ("1" creates the session on first input, "0" refuses)
--       7 session id (the ready set's member, with KEYS 11-12)
--       8 context (JSON text, "" or absent: the session's, meta `context`, if it has one; a
--         given one becomes the session's)   9 settings (JSON text, "" or absent)
--       10 steer max bytes   11 steer max queued count   12 steer max queued bytes
--       13 the steer's size: UTF-8 bytes of its text, not of its JSON (10-13: steers only)
--       14 the W3C trace context of the request that sent it ("" or absent: none)
--       15 a decision's call id   16 "1": the decision is the wait's timeout
--       17 the decision: "a" approve | "d" deny | "r" a result        (15-17: decisions only)
--       18 the stored layout level a claim must read to run this input ("" or absent: any;
--         a delegated turn's prompt: meta `newer` is raised to it, so an older release's
--         claims leave the session, claim.lua)
-- Returns {"ok", agent, state, seq, end_cursor, ui_cursor, created(0|1), wake(0|1), open turn}
--         {"repeated", agent, state, seq, end_cursor, ui_cursor, 0, wake(0|1), open turn}
--   wake: 1 when the sender should send a wake now; 0 when one it or another sender sent
--   less than WAKE_TRUST_MS ago is still outstanding (no claim took it), the session waits
--   for an agent no live worker runs (`noWorker`: the sweeper keeps it), or the input is done.
--         {"in_use", stored_kind} | {"unknown"} | {"too_large", limit} | {"queue_full", what, limit}
--         {"incomplete", key}: a key of the session is gone (_whole.lua); nothing stored
--         {"no_call"} | {"decided"} | {"expired"} | {"wrong_kind", "a"|"e"}: a decision for a
--         call the open turn does not wait on, one decided already, one whose wait timed out,
--         or one of the wrong kind (an approval for an external tool's call, a result for
--         one waiting for approval); nothing stored
--
-- A decision is taken only for a call of `paused` (append.lua's `pause` mark: `a:<id>`
-- waits for approval, `e:<id>` for a result) not yet in
-- `decided`; it joins `decided` (with its timeout, `expired` too) and counts in
-- `decisions` until the turn takes it: one decision per call, whichever server sent it.
--
-- Invariant: a message id names one input. The same id and kind again stores nothing and
-- reports the original (state w waiting | r its turn is open | d done); the same id with
-- the other kind is refused. One outstanding wake per session (§7): a stored input sets
-- meta `woken` (now_ms) and answers wake 1, unless a wake sent less than WAKE_TRUST_MS
-- ago is outstanding (no claim took it since): then it answers 0 and that wake, which
-- runs whatever waits, stands for this input too. Past WAKE_TRUST_MS a sender wakes again
-- (a wake lost by the broker costs a sender at most that long; the sweeper also finds it). Steer limits hold for the queued (unconsumed) steers, in
-- bytes of text as §6 counts them (ARGV 13), so quotes and escapes of the JSON never count.
-- The session is in the ready set before the input is stored (§5): given KEYS 11-12 (one
-- server, no slots), the script marks it first, as mark_ready.lua does, whatever it then
-- answers; on a cluster those keys sit in another slot, and the caller ran mark_ready.lua
-- before this call.

-- include: _whole.lua

local WAKE_TRUST_MS = 10000  -- fxworker/liveness.py SENDER_TRUST_MS
local meta, inbox, msgs, pending = KEYS[1], KEYS[3], KEYS[6], KEYS[7]
local kind, mid, input, agent, now_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if KEYS[11] then redis.call('ZADD', KEYS[11], 'GT', now_ms, ARGV[7]) end

local m = redis.call('HMGET', meta, 'agent', 'ui', 'inbox', 'steers', 'steer_bytes', 'expiring', 'context', 'head', 'epoch',
  'rest', 'turn', 'through', 'woken', 'unserved_ms', 'paused', 'decided', 'expired', 'decisions', 'newer')
local owner, ui = m[1], tonumber(m[2] or 0)
-- A session with a key gone is refused; one that was set to expire is gone: what is left
-- of it goes, and the input finds no session.
local lost
if owner then
  lost = lost_key(ui, tonumber(m[3] or 0), tonumber(m[8] or 0), tonumber(m[9] or 0), m[10], m[11], tonumber(m[12] or 0))
else
  lost = orphan_key()
end
if lost == 'expired' or (lost and m[6] == '1') then
  for i = 1, 10 do redis.call('DEL', KEYS[i]) end
  m, owner, ui = {}, nil, 0
elseif lost then
  return {'incomplete', lost}
end
local seq = tonumber(m[3] or 0) + 1
-- A wake sent for the session less than WAKE_TRUST_MS ago that no claim has taken yet; or
-- the session waits for an agent no live worker runs (`unserved_ms`, claim.lua): its wake
-- would wait in a queue nobody reads, and the sweeper keeps it.
local function outstanding()
  if m[14] then return true end
  return m[13] ~= nil and m[13] ~= false and tonumber(now_ms) - tonumber(m[13]) < WAKE_TRUST_MS
end
-- The size stored with the id is what append.lua gives back when the steer is consumed.
local size = tonumber(ARGV[13]) or string.len(input)

-- One command both looks the id up and takes it for this input; a refusal below gives it
-- back (the script is atomic, so no one sees it taken in between).
if redis.call('HSETNX', msgs, mid, kind .. ':w:' .. seq .. ':0:' .. size) == 0 then
  local k, state, at, endc = string.match(redis.call('HGET', msgs, mid), '^(%a):(%a):(%d+):(%d+)')
  if k ~= kind then return {'in_use', k} end
  local wake = 0
  if owner and state ~= 'd' and not outstanding() then
    redis.call('HSET', meta, 'woken', now_ms)
    wake = 1
  end
  return {'repeated', owner or '', state, tonumber(at), tonumber(endc), ui, 0, wake, m[11] or ''}
end

-- A decision: for a call the open turn waits on, once (decided at the door, not by the turn).
local decided = nil
if kind == 'd' then
  local call, paused = '\n' .. ARGV[15] .. '\n', m[15] or ''
  local approval = string.find(paused, '\na:' .. ARGV[15] .. '\n', 1, true)
  local external = string.find(paused, '\ne:' .. ARGV[15] .. '\n', 1, true)
  local refused
  if m[17] and string.find(m[17], call, 1, true) then
    refused = {'expired'}
  elseif m[16] and string.find(m[16], call, 1, true) then
    refused = {'decided'}
  elseif not (approval or external) then
    refused = {'no_call'}
  elseif (ARGV[17] == 'a' and not approval) or (ARGV[17] == 'r' and not external) then
    refused = {'wrong_kind', approval and 'a' or 'e'}
  end
  if refused then
    redis.call('HDEL', msgs, mid)
    return refused
  end
  decided = m[16] or '\n'
  decided = decided .. ARGV[15] .. '\n'
end

local fields = {'inbox', seq}
local wake = 0
if not outstanding() then
  -- The wake the sender sends next is outstanding until a delivery's claim takes it
  -- (claim.lua): neither the sweeper nor another sender queues a second one meanwhile.
  fields[3], fields[4], wake = 'woken', now_ms, 1
end
if not owner then
  if ARGV[6] ~= '1' then
    redis.call('HDEL', msgs, mid)
    return {'unknown'}
  end
  owner = agent
  fields[#fields + 1], fields[#fields + 2], fields[#fields + 3], fields[#fields + 4] = 'agent', agent, 'created_ms', now_ms
  -- Into the session index when created (NX: an older entry keeps its first-seen time).
  if KEYS[12] then redis.call('ZADD', KEYS[12], 'NX', now_ms, ARGV[7]) end
end
if kind == 's' then
  local steers, bytes = tonumber(m[4] or 0) + 1, tonumber(m[5] or 0) + size
  local max_bytes, max_count, max_total = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
  local refused
  if size > max_bytes then
    refused = {'too_large', max_bytes}
  elseif steers > max_count then
    refused = {'queue_full', 'count', max_count}
  elseif bytes > max_total then
    refused = {'queue_full', 'bytes', max_total}
  end
  if refused then
    redis.call('HDEL', msgs, mid)
    return refused
  end
  fields[#fields + 1], fields[#fields + 2], fields[#fields + 3], fields[#fields + 4] = 'steers', steers, 'steer_bytes', bytes
end
if decided then
  fields[#fields + 1], fields[#fields + 2] = 'decided', decided
  fields[#fields + 1], fields[#fields + 2] = 'decisions', tonumber(m[18] or 0) + 1
  if ARGV[16] == '1' then
    fields[#fields + 1], fields[#fields + 2] = 'expired', (m[17] or '\n') .. ARGV[15] .. '\n'
  end
end
local needs = tonumber(ARGV[18] or '')
if needs and needs > tonumber(m[19] or 0) then
  fields[#fields + 1], fields[#fields + 2] = 'newer', needs
end
if m[6] == '1' then
  -- New input revives a finished session that was set to expire.
  for i = 1, 10 do redis.call('PERSIST', KEYS[i]) end  -- the session's keys, not the index
  fields[#fields + 1], fields[#fields + 2] = 'expiring', 0
end

-- A given context becomes the session's; an input without one takes the session's (so a
-- context the server pinned at create holds for every later prompt and steer).
local context = ARGV[8] or ''
if context ~= '' then
  fields[#fields + 1], fields[#fields + 2] = 'context', context
else
  context = m[7] or ''
end
redis.call('HSET', meta, unpack(fields))
-- Context, settings and a trace context only when there are some: most inputs carry none.
local entry = {'k', kind, 'id', mid, 'in', input, 'at', now_ms}
if context ~= '' or (ARGV[9] or '') ~= '' then
  entry[#entry + 1], entry[#entry + 2], entry[#entry + 3], entry[#entry + 4] = 'cx', context, 'st', ARGV[9] or ''
end
if (ARGV[14] or '') ~= '' then entry[#entry + 1], entry[#entry + 2] = 'tp', ARGV[14] end
redis.call('XADD', inbox, seq .. '-0', unpack(entry))
redis.call('ZADD', pending, seq, mid)
return {'ok', owner, 'w', seq, 0, ui, m[1] and 0 or 1, wake, m[11] or ''}
