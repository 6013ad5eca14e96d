-- append.lua: the fenced write of a worker: journal records, their marks and UI lines.
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3 inbox (STREAM)  4 log (STREAM)  5 ui (STREAM)
--       6 msgs (HASH)  7 pending (ZSET)  8 keys (HASH)  9 ckpt (HASH)  10 rest -- one session, one slot
--       11 ready (ZSET)  -- optional, with a `release` mark on a standalone server ({~index} slot)
-- ARGV  1 epoch   2 now_ms   3 ttl_ms ("0" keeps finished sessions)   4 expected head
--       ("" unchecked, "0" none yet, else a log cursor)   5 n records   6 n lines
--       7 n store marks   8 call key: the idempotency key of a call with no records ("" none;
--       a call with records is keyed by its records), then per record: idempotency key, data, marks JSON, n marks,
--       n x (mark name, value); then n store marks x (name, value); then per line:
--       JSON text without its closing brace, message id it ends ("" unless a turn_end).
--       Mark names: start <turn id> | end | yield | accepted <input id> | step <name> |
--       done (the record finishes something: a model response or a tool result) |
--       drop <input id> (consumed without a turn: cancelled or refused before it started) |
--       pause <calls, `\n`-separated, each `a:<id>` (waits for approval) or `e:<id>` (for
--       an external tool's result)> (the open turn parks until those calls are decided:
--       meta `paused`; only a process reading PARKED_LEVEL claims it, meta `newer`) |
--       decided <call id> (the turn took that call's decision: it leaves `paused`) |
--       release <session id> (a store mark: once the call is stored, let the session go as
--       release.lua does, if no turn is open and no input waits; else it stays held) |
--       checkpoint <data> (a store mark, with release: when the session goes, the
--       checkpoint through the call's last record; it covers the whole log) |
--       pack <first>:<last>:<sha1 hex>:<adler32>:<z> (store marks, with release: when the
--       session goes, lines first..last become one entry `<last>-0` with fields f <first>,
--       z and the checksum checked here (s <sha1 hex>, or a <adler32> where the Lua has no
--       SHA-1), if they are plain lines whose NDJSON has it;
--       fxworker/store/_packed.py).
--       A line whose JSON text begins `{"type":"turn_start"` in the call that starts a
--       turn is that turn's start line: its cursor becomes the meta's `turn_cursor`.
-- Returns {"ok", head, {record cursors}, first_line, last_line, repeated(0|1), released(0|1),
--          lines packed}
--         {"fenced", lease_epoch, lease_state, lease_expires_ms}
--         {"conflict", head}   (expected is not the head: another engine appended)
--
-- Invariant: only the head of the epoch chain writes. A call whose epoch is not the
-- lease's, or whose lease was released or expired by now_ms, stores nothing at all (log,
-- marks and UI alike). A repeated idempotency key returns what the first call stored and
-- stores nothing, UI lines included; so does a repeated call key of a call with no records
-- (a line-only flush): the session keeps the newest such key only (meta `line_key`), as
-- its writer retries a call before it sends the next one. Line cursors are contiguous:
-- `N-0`, N = last + 1.
-- Progress (§6): the death count of the open turn restarts only on a record that names a
-- new step or carries `done`; so does `futile` (claims without progress, claim.lua), which
-- an input consumed (started, ended, accepted or dropped) restarts too; a resume record, a rerun's request, a steer or a yield
-- names the step the turn was at, so a turn that kills its worker every time is poison.
-- A call with a `release` mark stores what it carries and lets the lease go in one step:
-- nothing is written under the lease after it, and an input accepted after it finds the
-- session free. Its retry (the reply was lost) is fenced like any later call of the
-- epoch, and stores nothing: the idempotency keys went with the release (_at_rest.lua).
-- A parked turn (§6 "Paused turns"): `paused` names the calls it waits on, `decided` the
-- calls answered at the door (accept.lua; with `expired`, those its timeout answered),
-- `decisions` the answers no turn took yet. Its `end` drops those answers and the parked
-- state; `decided` and `expired` stay until the next turn starts, so a late answer for one
-- of its calls is told it was decided (or expired), not that no such call waited.
-- Packing (§5 "Packed at rest") changes how lines are stored, never which: the chunks
-- replace the entries of the same lines, checked against their SHA-1, in this call, so a
-- reader sees one or the other; any mismatch leaves every entry as it was.
--
-- Reads top-down: `append()` is the call, one line per job (the fence, a repeated call, the
-- records with their marks, the store marks, the lines, the keys and meta, letting the
-- session go or expire); each job is a local function below it, in that order.

-- include: _rest.lua
-- include: _at_rest.lua

local meta, lease, log, ui, msgs, pending, keys = KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local epoch, now_ms, ttl_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local nrec, nlines, nmarks = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local RECORDS_AT = 9  -- the ARGV index of the first record
local PARKED_LEVEL = 2  -- the stored layout level a parked turn needs (fxworker/store/types.py LAYOUT_LEVEL)

-- The session as the call finds and changes it: the meta fields read before anything is
-- written (`read_meta`), those to write at the end (`changed`), and what the marks ask for.
local head, ui_last, turn, step, cancel, spared, paused, decisions, decided
local changed = {}
local ended = false
local release = nil  -- the session id of a `release` mark
local checkpoint = nil  -- the data of a `checkpoint` mark
local packs = {}  -- the values of `pack` marks
local starting = false  -- a turn started in this call; its turn_start line may be in it

local fenced, read_meta, repeated, store_records, apply_store_marks, store_lines, remember_keys, write_meta,
  let_go_or_expire, consume, unpark, apply, pack_lines

local function append()
  local refused = fenced()
  if refused then return refused end
  read_meta()
  local call_key = ''
  if nrec == 0 then call_key = ARGV[8] end
  local again = repeated(call_key)
  if again then return again end
  if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= head then return {'conflict', head} end
  local cursors, i = store_records(RECORDS_AT)
  i = apply_store_marks(i)
  local first = ui_last + 1
  store_lines(i)
  remember_keys(cursors, first, call_key)
  write_meta()
  local released, packed = let_go_or_expire()
  return {'ok', head, cursors, first, ui_last, 0, released, packed}
end

-- The refusal of a call whose epoch does not hold a live lease, or nil.
function fenced()
  local l = redis.call('HMGET', lease, 'epoch', 'state', 'expires_ms')
  if tonumber(l[1] or 0) ~= epoch or l[2] ~= 'held' or tonumber(l[3] or 0) <= now_ms then
    return {'fenced', tonumber(l[1] or 0), l[2] or '', tonumber(l[3] or 0)}
  end
  return nil
end

function read_meta()
  local m = redis.call('HMGET', meta, 'head', 'ui', 'turn', 'step', 'cancel', 'spared', 'paused', 'decisions', 'decided')
  head, ui_last, turn, step, cancel = tonumber(m[1] or 0), tonumber(m[2] or 0), m[3] or '', m[4] or '', m[5] or ''
  spared, paused, decisions, decided = m[6], m[7] or '', tonumber(m[8] or 0), m[9]
end

-- The reply of a retry of a call that already ran (its reply was lost), or nil: it reports
-- what the first call stored and stores nothing.
function repeated(call_key)
  local again = nil
  if nrec > 0 then again = redis.call('HGET', keys, ARGV[RECORDS_AT])
  elseif call_key ~= '' then again = redis.call('HGET', keys, call_key) end
  if not again then return nil end
  local cursors, i = {}, RECORDS_AT
  for _ = 1, nrec do
    local v = redis.call('HGET', keys, ARGV[i]) or again
    cursors[#cursors + 1] = string.match(v, '^(%d+)')
    i = i + 4 + 2 * tonumber(ARGV[i + 3])
  end
  local _, first, last = string.match(again, '^(%d+):(%d+):(%d+)')
  return {'ok', head, cursors, tonumber(first), tonumber(last), 1, 0, 0}
end

-- Appends the records to the log and applies their marks; returns their cursors and the
-- ARGV index after them.
function store_records(i)
  local cursors = {}
  for _ = 1, nrec do
    local key, data, marks_json, n = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
    head = head + 1
    redis.call('XADD', log, head .. '-0', 'k', key, 'd', data, 'e', epoch, 'm', marks_json)
    cursors[#cursors + 1] = tostring(head)
    local named, done = nil, false
    for j = 0, n - 1 do
      local name, value = ARGV[i + 4 + 2 * j], ARGV[i + 5 + 2 * j]
      apply(name, value)
      if name == 'step' then named = value elseif name == 'done' then done = true end
    end
    -- Real progress (a new step, or something finished) restarts the death count; the
    -- cut-off count restarts unless the record names the same step as before (§6: a step
    -- cut off 3 times in a row is not run again).
    if done or (named ~= nil and named ~= step) then changed.deaths, changed.futile = 0, 0 end
    if named == nil or named ~= step then
      changed.cutoffs = 0
      if named ~= nil then step = named; changed.step = named end
    end
    i = i + 4 + 2 * n
  end
  return cursors, i
end

-- Applies the marks sent without a record; returns the ARGV index after them.
function apply_store_marks(i)
  for _ = 1, nmarks do
    apply(ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  return i
end

-- Appends the lines to `ui` with their epoch and cursor; a `turn_end` line's cursor is
-- noted as its message's end cursor.
function store_lines(i)
  for _ = 1, nlines do
    ui_last = ui_last + 1
    local text = ARGV[i] .. ',"epoch":' .. epoch .. ',"cursor":' .. ui_last .. '}'
    if starting and string.sub(ARGV[i], 1, 20) == '{"type":"turn_start"' then
      changed.turn_cursor, starting = ui_last, false
    end
    redis.call('XADD', ui, ui_last .. '-0', 'l', text)
    local ends = ARGV[i + 1]
    if ends ~= '' then
      local v = redis.call('HGET', msgs, ends)
      if v then
        local k, s, seq, _, size = string.match(v, '^(%a):(%a):(%d+):(%d+):(%d+)')
        redis.call('HSET', msgs, ends, k .. ':' .. s .. ':' .. seq .. ':' .. ui_last .. ':' .. size)
      end
    end
    i = i + 2
  end
end

-- Each key remembers its cursor and the call's line range, for a retried call.
function remember_keys(cursors, first, call_key)
  local j = RECORDS_AT
  for r = 1, nrec do
    redis.call('HSET', keys, ARGV[j], cursors[r] .. ':' .. first .. ':' .. ui_last)
    j = j + 4 + 2 * tonumber(ARGV[j + 3])
  end
  if call_key ~= '' then
    -- Only the newest call key is kept (its cursor part: the log head it followed), so
    -- line flushes do not grow the hash between compactions.
    local previous = redis.call('HGET', meta, 'line_key')
    if previous and previous ~= call_key then redis.call('HDEL', keys, previous) end
    redis.call('HSET', keys, call_key, head .. ':' .. first .. ':' .. ui_last)
    changed.line_key = call_key
  end
end

function write_meta()
  changed.head, changed.ui = head, ui_last
  -- Takeovers spared after outages (claim.lua) restart with the deaths.
  if spared and changed.deaths == 0 then redis.call('HDEL', meta, 'spared') end
  local flat = {}
  for k, v in pairs(changed) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  redis.call('HSET', meta, unpack(flat))
end

-- With a `release` mark and nothing left to run, lets the session go (its checkpoint
-- replacing the log, its lines packed); else a turn that ended with nothing waiting
-- starts the retention TTL. Returns released (0|1) and the lines packed.
function let_go_or_expire()
  local released, packed = 0, 0
  if release and turn == '' and redis.call('ZCARD', pending) == 0 then
    redis.call('HSET', lease, 'state', 'released', 'expires_ms', 0)
    if checkpoint then
      -- Through the call's last record: the whole log, which goes (at rest: no `rest`).
      redis.call('HSET', KEYS[9], 'data', checkpoint, 'through', head)
      redis.call('DEL', log, KEYS[10])
      redis.call('HDEL', meta, 'rest')
      redis.call('HSET', meta, 'through', head)
    end
    if #packs > 0 then packed = pack_lines() end
    at_rest(ttl_ms, KEYS[11], release)  -- the retention TTL too
    released = 1
  elseif ended and ttl_ms > 0 and turn == '' and redis.call('ZCARD', pending) == 0 then
    -- Retention: a session whose turn ended with nothing waiting expires after ttl_ms.
    for k = 1, 10 do redis.call('PEXPIRE', KEYS[k], ttl_ms) end
    redis.call('HSET', meta, 'expiring', 1)  -- accept.lua persists them again
  end
  return released, packed
end

-- -- the marks ------------------------------------------------------------------------

-- Moves input `id` to `state` (r running, d done); returns its inbox seq (0: unknown id).
function consume(id, state)
  local v = redis.call('HGET', msgs, id)
  if not v then return 0 end
  changed.futile = 0  -- an input moved on: progress (claim.lua counts claims without it)
  local k, s, seq, endc, size = string.match(v, '^(%a):(%a):(%d+):(%d+):(%d+)')
  if s == 'w' then
    redis.call('ZREM', pending, id)
    if k == 'd' then
      decisions = decisions - 1
      changed.decisions = decisions
    elseif k == 's' then
      redis.call('HINCRBY', meta, 'steers', -1)
      redis.call('HINCRBY', meta, 'steer_bytes', -tonumber(size))
    end
  end
  redis.call('HSET', msgs, id, k .. ':' .. state .. ':' .. seq .. ':' .. endc .. ':' .. size)
  if state == 'd' and cancel == id then cancel = ''; changed.cancel = '' end
  return tonumber(seq)
end

-- The turn's end: the answers no turn took are dropped, and the parked state goes.
function unpark()
  if decisions > 0 then
    for _, id in ipairs(redis.call('ZRANGE', pending, 0, -1)) do
      local v = redis.call('HGET', msgs, id)
      if v and string.sub(v, 1, 4) == 'd:w:' then consume(id, 'd') end
    end
  end
  paused, decisions = '', 0
  changed.paused, changed.decisions = '', 0
end

function apply(name, value)
  if name == 'start' then
    if turn ~= value then
      if turn ~= '' then consume(turn, 'd') end
      local seq = consume(value, 'r')
      turn, step = value, ''
      changed.turn, changed.turn_seq, changed.yielded, changed.cutoffs, changed.deaths, changed.step =
        value, seq, 0, 0, 0, ''
      -- Until its start line is seen below: the newest stored line, which is that line
      -- when it was written ahead of the record.
      changed.turn_cursor, starting = ui_last, true
      redis.call('HINCRBY', meta, 'turns', 1)
      if decided then redis.call('HDEL', meta, 'decided', 'expired'); decided = nil end  -- the last turn's
    end
  elseif name == 'end' then
    if turn ~= '' then
      consume(turn, 'd')
      changed.last_turn = turn
    end
    if paused ~= '' or decisions > 0 then unpark() end
    turn, step, ended, starting = '', '', true, false
    changed.turn, changed.turn_seq, changed.yielded, changed.cutoffs, changed.deaths, changed.step = '', 0, 0, 0, 0, ''
    changed.turn_cursor = 0
  elseif name == 'yield' then
    changed.yielded = 1
  elseif name == 'accepted' then
    consume(value, 'd')
  elseif name == 'drop' then
    consume(value, 'd')
    -- deaths counted before a turn opened were the dropped input's (claim.lua)
    if turn == '' then changed.deaths = 0 end
  elseif name == 'pause' then
    paused = '\n' .. value .. '\n'
    -- Parking is progress: the turn reached the calls it waits on.
    changed.paused, changed.newer, changed.deaths, changed.futile = paused, PARKED_LEVEL, 0, 0
  elseif name == 'decided' then
    local at = string.find(paused, '\na:' .. value .. '\n', 1, true) or string.find(paused, '\ne:' .. value .. '\n', 1, true)
    if at then
      paused = string.sub(paused, 1, at) .. string.sub(paused, at + #value + 4)
      if paused == '\n' then paused = '' end
      changed.paused = paused
    end
  elseif name == 'release' then
    release = value
  elseif name == 'checkpoint' then
    checkpoint = value
  elseif name == 'pack' then
    packs[#packs + 1] = value
  end
end

-- -- packing at rest ------------------------------------------------------------------

-- The `pack` chunks, when they are exactly the lines from the first one's first on (all
-- plain entries, each chunk's NDJSON with its SHA-1), replace those entries: the work, the
-- AOF and what replicas receive are bounded by the claim and one stream node, whatever the
-- session's length. The entries are the stream's tail: they are deleted, the stream's last
-- id is lowered below them (XSETID: Redis 7 allows any id not below its top remaining
-- entry) and the chunks are added at their ids. Redis keeps a deleted entry in its node
-- until every entry of the node is gone, so the entries before them that share the first
-- one's node are deleted too, newest first, until XINFO's node count drops (a node holds
-- at most stream-node-max-entries, 100 by default; past MOVE_MAX, on a server set to
-- larger nodes, the node keeps the copies of those moved), and added back before the
-- chunks: no deleted entry stays stored. A reader blocked at the end waits on: every id
-- added is at most the last one it saw. Returns the lines packed (0: nothing changed).
-- fakeredis's Lua (the embedded store) has no XSETID (its `redis.pcall` errors) and no
-- redis.sha1hex: there the stream is rebuilt (DEL, every earlier entry added again, then
-- the chunks; embedded sessions are small) and Adler-32 is checked.
local MOVE_MAX = 128
local MOVE_BATCH = 16  -- entries read at a time to move (a node holds ~15 chunks of a short turn)
local XDEL_BATCH = 512  -- ids per XDEL (Lua's unpack limit)

local function adler32(s)
  local a, b = 1, 0
  for i = 1, #s do
    a = (a + string.byte(s, i)) % 65521
    b = (b + a) % 65521
  end
  return b * 65536 + a
end

-- The stream's node count (XINFO's radix-tree-keys), nil where XINFO does not say.
local function stream_nodes()
  local info = redis.pcall('XINFO', 'STREAM', ui)
  if type(info) ~= 'table' or info.err then return nil end
  for n = 1, #info - 1, 2 do
    if info[n] == 'radix-tree-keys' then return info[n + 1] end
  end
  return nil
end

function pack_lines()
  local chunks = {}
  for _, v in ipairs(packs) do
    local a, b, sha, adler, at = string.match(v, '^(%d+):(%d+):(%x+):(%d+):()')
    if not a then return 0 end
    chunks[#chunks + 1] = {tonumber(a), tonumber(b), sha, string.sub(v, at), tonumber(adler), adler}
  end
  local from = chunks[1][1]
  local entries = redis.call('XRANGE', ui, from .. '-0', '+')
  if #entries ~= ui_last - from + 1 then return 0 end
  local k = 1
  for _, c in ipairs(chunks) do
    local texts = {}
    for n = c[1], c[2] do
      local e = entries[k]
      if e == nil or e[1] ~= n .. '-0' or e[2][1] ~= 'l' then return 0 end
      texts[#texts + 1] = e[2][2]
      k = k + 1
    end
    local ndjson = table.concat(texts, '\n')
    if redis.sha1hex then
      if redis.sha1hex(ndjson) ~= c[3] then return 0 end
    elseif adler32(ndjson) ~= c[5] then
      return 0
    end
  end
  if k ~= #entries + 1 then return 0 end
  local ids = {}
  for n = from + 1, ui_last do
    ids[#ids + 1] = n .. '-0'
    if #ids == XDEL_BATCH then redis.call('XDEL', ui, unpack(ids)); ids = {} end
  end
  if #ids > 0 then redis.call('XDEL', ui, unpack(ids)) end
  local nodes = stream_nodes()
  redis.call('XDEL', ui, from .. '-0')
  local lowered = redis.pcall('XSETID', ui, (from - 1) .. '-0')
  local moved = {}
  if type(lowered) == 'table' and lowered.err then
    local kept = redis.call('XRANGE', ui, '-', '+')
    redis.call('DEL', ui)
    for _, e in ipairs(kept) do redis.call('XADD', ui, e[1], unpack(e[2])) end
  elseif nodes ~= nil then
    -- The node of the first line went with it, or the entries before it in that node go too.
    local now = stream_nodes()
    while now == nodes and #moved < MOVE_MAX do
      local newest = redis.call('XREVRANGE', ui, '+', '-', 'COUNT', MOVE_BATCH)
      if #newest == 0 then break end
      for _, e in ipairs(newest) do
        moved[#moved + 1] = e
        redis.call('XDEL', ui, e[1])
        nodes, now = now, stream_nodes()
        if now ~= nodes or #moved == MOVE_MAX then break end
      end
    end
    if #moved > 0 then
      redis.call('XSETID', ui, (tonumber(string.match(moved[#moved][1], '^(%d+)')) - 1) .. '-0')
      for m = #moved, 1, -1 do redis.call('XADD', ui, moved[m][1], unpack(moved[m][2])) end
    end
  end
  -- The checksum checked above goes with the chunk: a reader checks what it inflates.
  for _, c in ipairs(chunks) do
    if redis.sha1hex then
      redis.call('XADD', ui, c[2] .. '-0', 'f', c[1], 'z', c[4], 's', c[3])
    else
      redis.call('XADD', ui, c[2] .. '-0', 'f', c[1], 'z', c[4], 'a', c[6])
    end
  end
  return #entries
end

return append()
