-- claim.lua: take a session's lease and read everything a worker needs to continue it.
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3 inbox (STREAM)  4 log (STREAM)  5 ui (STREAM)
--       6 msgs (HASH)  7 pending (ZSET)  8 keys (HASH)  9 ckpt (HASH)  10 rest -- one session, one slot
-- ARGV  1 holder   2 lease_ms   3 now_ms   4 "1": only when there is work
--       5 the agents the caller can run, comma-separated ("" or absent: any)
--       6 give-up ms (with 5: how long a session may wait for an agent nobody runs)
--       7 the longest wait between two wakes of such a session (ms)
--       8 when the caller last met a store outage (ms; "0": never)
--       9 the newest stored layout level the caller reads ("" or absent: any)
-- Returns {"newer", level} when a holder met a stored layout it could not read (meta
-- `newer`, release.lua) and the caller reads below `level`: nothing is taken (epoch,
-- counts and lease stay), the wake is spent, a newer process takes the session;
-- {"held", holder, epoch, expires_ms} when a live lease stands, {"unknown"} for
-- no such session, {"incomplete", key} for one with a key gone (_whole.lua),
-- {"idle", epoch, agent} when ARGV[4] is "1", no lease is held, no turn is open
-- and no input waits (a second wake of work a delivery already ran: nothing changes), or
-- the open turn is parked (its calls wait for decisions, none has come and no cancel
-- names it: a prompt queued behind it waits too; nothing is counted, no lease taken),
-- {"unserved", agent, since_ms, next_ms, spare(0|1)} when the owning agent is not among
-- ARGV[5] (nothing taken: lease and epoch stay; meta counts the miss and when to wake
-- next; spare: another wake is due at next_ms already, this one counted nothing; the
-- first miss since the last claim also appends one `session_waiting` line, naming the
-- open turn or first waiting input and `noWorker {agent, sinceMs}`, at the meta's
-- epoch: a client following the turn sees why nothing runs), else
--   {"ok", epoch, expires_ms, agent, has_ckpt(0|1), ckpt_data, ckpt_through,
--    records {cursor, data, ...}, head, pending {{seq, field, value, ...}, ...},
--    turn, yielded, cutoffs, deaths, cancel_target, ui_cursor, taken_over(0|1),
--    inbox_seq, turn_input {seq, field, value, ...} or {}, turn_cursor, give_up(0|1), futile}
--   turn_cursor: the UI cursor of the open turn's `turn_start` line (0: no turn open, or
--   not known), so a resume reads the open turn's lines without scanning the stream.
--   give_up: the owning agent is not among ARGV[5] and the session has waited for it
--   longer than ARGV[6]: the lease is taken so the caller ends its inputs (FX_NO_AGENT).
--   futile: the claims (this one included) since an input or a step last moved on.
--
-- Invariant: at most one live lease. A claim succeeds only when no lease is held or the
-- held one expired by now_ms; it bumps the epoch (never reused, even after a release), so
-- every later write of the previous holder is refused. A claim by the holder of the live
-- lease (its first call ran but the reply was lost) answers the same epoch again and
-- counts nothing, so a claim is safe to retry under one holder id. A takeover (the previous lease
-- expired while held) with a turn open counts one more death of that turn; with no turn
-- open but inputs pending, one more death of the first of them (its worker died, or failed
-- past handling, before its turn opened): a `start`, `end` or `drop` restarts the count,
-- so an input no worker can open is ended after 3 (§6, nothing loops for ever). A holder
-- whose last renewal came before a store outage the caller met (ARGV[8]) is spared (meta
-- `spared`, reset with the deaths): a failover or a full Redis silences every holder at
-- once, and three of them in a row must not end a healthy turn as poison. Past
-- MAX_SPARED such takeovers without progress they count again.
-- The epoch is also kept in meta, so a lease key that is gone cannot restart the count:
-- such a session is refused whole (`incomplete`), never claimed at epoch 1 again.
-- A session whose agent the caller cannot run is not claimed: its wakes back off in meta
-- (unserved_ms: the first miss, unserved_n, unserved_next_ms: 250 ms doubling to ARGV[7]);
-- a claim of a caller that can run it forgets them.
-- Every claim that finds the session held, idle or claims it is a delivery of its
-- outstanding wake: meta `woken` (set by accept.lua and woken.lua) goes, so the next one
-- may be queued (§7: one outstanding wake per session). An `unserved` answer keeps it: a
-- wake that reached a process without the agent is not the one queued for a worker that
-- has it, and a wake passed on from here is sent only when none is outstanding.

-- include: _whole.lua
-- include: _rest.lua

local MAX_SPARED = 6  -- takeovers after an outage not counted as deaths, between two progresses

local meta, lease, inbox, log, pending, ckpt = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7], KEYS[9]
local holder, lease_ms, now_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- One `session_waiting` line: agent names and message ids are checked ([A-Za-z0-9._-]),
-- so the JSON is written as text, as append.lua stamps its lines.
local function waiting_line(agent, since_ms, open, at_epoch)
  local target = open
  if target == '' then target = redis.call('ZRANGE', pending, 0, 0)[1] or '' end
  local cursor = redis.call('HINCRBY', meta, 'ui', 1)
  redis.call('XADD', KEYS[5], cursor .. '-0', 'l', '{"type":"session_waiting","messageId":"' .. target ..
    '","noWorker":{"agent":"' .. agent .. '","sinceMs":' .. string.format('%d', since_ms) .. '},"epoch":' ..
    at_epoch .. ',"cursor":' .. cursor .. '}')
end

local l = redis.call('HMGET', lease, 'holder', 'epoch', 'expires_ms', 'state')
local epoch = tonumber(l[2] or 0)
local taken, again = 0, 0
if l[4] == 'held' then
  if tonumber(l[3] or 0) > now_ms then
    if l[1] ~= holder then
      redis.call('HDEL', meta, 'woken')
      return {'held', l[1], epoch, tonumber(l[3])}
    end
    again = 1  -- this holder's own claim, retried after a lost reply: the same epoch
  else
    taken = 1
  end
end
local m = redis.call('HMGET', meta, 'agent', 'head', 'ui', 'inbox', 'turn', 'turn_seq', 'yielded', 'cutoffs', 'deaths', 'cancel',
                       'turn_cursor', 'epoch', 'unserved_ms', 'unserved_n', 'expiring', 'unserved_next_ms', 'spared',
                       'rest', 'through', 'woken', 'futile', 'newer', 'paused', 'decisions')
if not m[1] then
  if orphan_key() == 'meta' then return {'incomplete', 'meta'} end
  return {'unknown'}
end
local lost = lost_key(tonumber(m[3] or 0), tonumber(m[4] or 0), tonumber(m[2] or 0), tonumber(m[12] or 0),
                      m[18], m[5], tonumber(m[19] or 0))
if lost then
  -- A session set to expire that lost a key is expiring: gone, as if it had.
  if m[15] == '1' then return {'unknown'} end
  return {'incomplete', lost}
end
local turn = m[5] or ''
local give_up = 0
local reads = tonumber(ARGV[9] or '')
if again == 0 and m[22] and reads and tonumber(m[22]) > reads then
  if m[20] then redis.call('HDEL', meta, 'woken') end
  return {'newer', tonumber(m[22])}
end
-- After the script's first write that memory may refuse, so a full Redis still refuses
-- the claim whole (a write made first would let every later one through).
local function took_wake() if m[20] then redis.call('HDEL', meta, 'woken') end end
if again == 0 then
  local parked = turn ~= '' and (m[23] or '') ~= '' and tonumber(m[24] or 0) == 0 and m[10] ~= turn
  if ARGV[4] == '1' and (parked or (taken == 0 and turn == '' and redis.call('ZCARD', pending) == 0)) then
    took_wake()
    return {'idle', epoch, m[1]}
  end
  local served = ARGV[5] or ''
  if served ~= '' and not string.find(',' .. served .. ',', ',' .. m[1] .. ',', 1, true) then
    local since, n = tonumber(m[13] or now_ms), tonumber(m[14] or 0) + 1
    if now_ms - since < tonumber(ARGV[6]) then
      -- Another wake is due later: this one is spare (one wake at a time backs off).
      local due = tonumber(m[16] or 0)
      if due > now_ms + 50 then return {'unserved', m[1], since, due, 1} end
      local next_ms = now_ms + math.min(tonumber(ARGV[7]), 250 * 2 ^ math.min(n - 1, 32))
      if not m[13] then waiting_line(m[1], since, turn, math.max(epoch, tonumber(m[12] or 0))) end
      redis.call('HSET', meta, 'unserved_ms', string.format('%d', since), 'unserved_n', n,
        'unserved_next_ms', string.format('%d', next_ms))
      return {'unserved', m[1], since, next_ms, 0}
    end
    give_up = 1
  end
  if m[13] then redis.call('HDEL', meta, 'unserved_ms', 'unserved_n', 'unserved_next_ms') end
  epoch = math.max(epoch, tonumber(m[12] or 0)) + 1
  redis.call('HSET', meta, 'epoch', epoch)
end
local expires = now_ms + lease_ms
redis.call('HSET', lease, 'holder', holder, 'epoch', epoch, 'expires_ms', string.format('%d', expires), 'state', 'held')
took_wake()
if m[22] then redis.call('HDEL', meta, 'newer') end  -- a process that reads it took it
-- Claims since the session last made progress (append.lua restarts the count): a bound on
-- any path that claims again and again without moving an input or a step on (§6).
local futile = tonumber(m[21] or 0)
if again == 0 then futile = redis.call('HINCRBY', meta, 'futile', 1) end
if m[18] then rest_thaw() end  -- at rest: the log goes back into its stream

local deaths = tonumber(m[9] or 0)
if taken == 1 and (turn ~= '' or redis.call('ZCARD', pending) > 0) then
  -- A holder silent since a store outage the caller saw (ARGV[8]: its last failed store
  -- call, after the holder's last renewal) may have been cut off by that outage, not have
  -- died: spared, up to MAX_SPARED times without progress (a store that keeps failing
  -- must not keep a turn that kills its workers from ending).
  local cut_off = tonumber(ARGV[8] or 0) >= tonumber(l[3] or 0) - lease_ms
  if cut_off and tonumber(m[17] or 0) < MAX_SPARED then
    redis.call('HINCRBY', meta, 'spared', 1)
  else
    deaths = redis.call('HINCRBY', meta, 'deaths', 1)
  end
end

local function entry(seq)
  local found = redis.call('XRANGE', inbox, seq .. '-0', seq .. '-0')
  if #found == 0 then return {} end
  local out = {seq}
  for _, v in ipairs(found[1][2]) do out[#out + 1] = v end
  return out
end

local c = redis.call('HMGET', ckpt, 'data', 'through')
local has_ckpt, through = 0, 0
if c[2] then has_ckpt, through = 1, tonumber(c[2]) end

local records = {}
for _, e in ipairs(redis.call('XRANGE', log, (through + 1) .. '-0', '+')) do
  local f = e[2]
  local data = ''
  for i = 1, #f, 2 do if f[i] == 'd' then data = f[i + 1] end end
  records[#records + 1] = string.match(e[1], '^(%d+)')
  records[#records + 1] = data
end

local waiting = {}
local ids = redis.call('ZRANGE', pending, 0, -1, 'WITHSCORES')
for i = 1, #ids, 2 do waiting[#waiting + 1] = entry(ids[i + 1]) end

local turn_input = {}
if turn ~= '' and tonumber(m[6] or 0) > 0 then turn_input = entry(m[6]) end

return {'ok', epoch, expires, m[1] or '', has_ckpt, c[1] or '', through, records,
        tonumber(m[2] or 0), waiting, turn, tonumber(m[7] or 0), tonumber(m[8] or 0), deaths,
        m[10] or '', tonumber(m[3] or 0), taken, tonumber(m[4] or 0), turn_input,
        turn ~= '' and tonumber(m[11] or 0) or 0, give_up, futile}
