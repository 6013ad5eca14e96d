-- _rest.lua: a session at rest keeps its lines and its log as one value. Not a script of
-- its own: scripts.py puts it in place of the line `-- include: _rest.lua` of a script
-- whose KEYS 1-10 are one session's.
--
-- Each stream costs Redis some 400 B of its own besides its entries; one string costs its
-- bytes. A release that leaves the session at rest moves the log and every line but the
-- last into `rest` (KEYS[10]); the lines stream keeps its last line, so a reader blocked
-- or reading after a cursor before it is answered at once and finds the lines it missed
-- in `rest` (cursors are contiguous: a first line past its cursor + 1 says so). The next
-- claim puts both back into their streams, with their ids, and deletes `rest`.
--
-- The value: items `<length>:<bytes>`, in order: the number of lines, each line's cursor
-- and JSON text; the number of records, each record's cursor, d and e (append.lua's data
-- and writer epoch; its k and m are for the idempotency keys, which go at rest, and for
-- reading by hand). `fxworker.store._replies.parse_rest` reads it.
--
-- rest_pack(ui_last) -> true when the streams went into `rest` (nothing when it exists
--   already); the consumed inbox goes too, and the fields of meta only an open turn uses
-- rest_thaw() -> puts `rest` back into the streams (nothing when it does not exist)

local function rest_pack(ui_last)
  local meta, inbox, log, ui, rest = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[10]
  if redis.call('EXISTS', rest) == 1 then return false end
  local lines = ui_last > 1 and redis.call('XRANGE', ui, '-', (ui_last - 1) .. '-0') or {}
  local records = redis.call('XRANGE', log, '-', '+')
  local out = {}
  local function put(v)
    out[#out + 1] = #v .. ':'
    out[#out + 1] = v
  end
  local function cursor(id) put(string.match(id, '^(%d+)')) end
  put(tostring(#lines))
  for _, e in ipairs(lines) do
    cursor(e[1])
    put(e[2][2])  -- the only field: l
  end
  put(tostring(#records))
  for _, e in ipairs(records) do
    local f = {}
    for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
    cursor(e[1])
    put(f.d or '')
    put(f.e or '')
  end
  redis.call('SET', rest, table.concat(out))
  redis.call('DEL', log, inbox)
  -- What only an open turn reads goes (absent reads as 0 or ""): 'end' set these so.
  local zero = {'turn', 'turn_seq', 'turn_cursor', 'yielded', 'cutoffs', 'deaths'}
  local v = redis.call('HMGET', meta, unpack(zero))
  local gone = {}
  for i, name in ipairs(zero) do
    if v[i] == '0' or v[i] == '' then gone[#gone + 1] = name end
  end
  if #gone > 0 then redis.call('HDEL', meta, unpack(gone)) end
  if #lines > 0 then
    -- A new stream of the last line (XTRIM would only mark the others deleted in place).
    local last = redis.call('XRANGE', ui, ui_last .. '-0', ui_last .. '-0')
    redis.call('DEL', ui)
    for _, e in ipairs(last) do redis.call('XADD', ui, e[1], unpack(e[2])) end
  end
  redis.call('HSET', meta, 'rest', 1)
  return true
end

local function rest_thaw()
  local meta, log, ui, rest = KEYS[1], KEYS[4], KEYS[5], KEYS[10]
  local s = redis.call('GET', rest)
  if not s then return end
  local pos = 1
  local function take()
    local colon = string.find(s, ':', pos, true)
    local n = tonumber(string.sub(s, pos, colon - 1))
    local v = string.sub(s, colon + 1, colon + n)
    pos = colon + n + 1
    return v
  end
  -- At rest the lines stream holds the last line only: the archived ones go in before it.
  local last = redis.call('XRANGE', ui, '-', '+')
  local nlines = tonumber(take())
  if nlines > 0 then redis.call('DEL', ui) end
  for _ = 1, nlines do
    local id = take()
    redis.call('XADD', ui, id .. '-0', 'l', take())
  end
  if nlines > 0 then
    for _, e in ipairs(last) do redis.call('XADD', ui, e[1], unpack(e[2])) end
  end
  for _ = 1, tonumber(take()) do
    local id = take()
    local d = take()
    redis.call('XADD', log, id .. '-0', 'd', d, 'e', take())
  end
  redis.call('DEL', rest)
  redis.call('HDEL', meta, 'rest')
  -- A session set to expire keeps its keys' deadline (accept.lua takes it off all of them).
  local ttl = redis.call('PTTL', meta)
  if ttl > 0 then
    redis.call('PEXPIRE', ui, ttl)
    redis.call('PEXPIRE', log, ttl)
  end
end
