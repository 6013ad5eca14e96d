-- _rest.lua: a session at rest keeps its log as one value. Not a script of its own:
-- scripts.py puts it in place of the line `-- include: _rest.lua` of a script whose KEYS
-- 1-10 are one session's.
--
-- A stream costs Redis some 400 B of its own besides its entries; one string costs its
-- bytes. A release that leaves the session at rest moves the log's records into `rest`
-- (KEYS[10]) and deletes the log; the next claim puts them back into the log, with their
-- ids, and deletes `rest`. The log is short (compaction trims what a checkpoint covers)
-- and the claim reads all of it anyway. The lines stay in their stream: it stores them as
-- compactly, and readers follow it.
--
-- The value: items `<length>:<bytes>`, three per record: its cursor, d and e (append.lua's
-- data and writer epoch; its k and m serve the idempotency keys, which go at rest, and
-- reading by hand). `fxworker.store._replies.parse_rest` reads it.
--
-- rest_log() -> the log's records go into `rest` (an empty log goes); a parked turn's
--   release (release.lua) does only this: its input stays in the inbox
-- rest_pack() -> rest_log(), and the consumed inbox goes, and so do the fields of meta
--   only an open turn uses, which read as 0 or ""
-- rest_thaw() -> puts `rest` back into the log (nothing when it does not exist)

local function rest_log()
  local meta, log, rest = KEYS[1], KEYS[4], KEYS[10]
  if redis.call('EXISTS', rest) == 1 then return end
  local records = redis.call('XRANGE', log, '-', '+')
  if #records > 0 then
    local out = {}
    local function put(v)
      out[#out + 1] = #v .. ':'
      out[#out + 1] = v
    end
    for _, e in ipairs(records) do
      local f = {}
      for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
      put(string.match(e[1], '^(%d+)'))
      put(f.d or '')
      put(f.e or '')
    end
    redis.call('SET', rest, table.concat(out))
    redis.call('HSET', meta, 'rest', 1)
  end
  -- An empty log goes too: with records appended (head > 0), a checkpoint covers them.
  redis.call('DEL', log)
end

local function rest_pack()
  local meta = KEYS[1]
  rest_log()
  redis.call('DEL', KEYS[3])  -- the inbox, all consumed
  local zero = {'turn', 'turn_seq', 'turn_cursor', 'yielded', 'cutoffs', 'deaths'}
  local v = redis.call('HMGET', meta, unpack(zero))
  local gone = {}
  for i, name in ipairs(zero) do
    if v[i] == '0' or v[i] == '' then gone[#gone + 1] = name end
  end
  if #gone > 0 then redis.call('HDEL', meta, unpack(gone)) end
end

local function rest_thaw()
  local meta, log, rest = KEYS[1], KEYS[4], KEYS[10]
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
  while pos <= #s do
    local id = take()
    local d = take()
    redis.call('XADD', log, id .. '-0', 'd', d, 'e', take())
  end
  redis.call('DEL', rest)
  redis.call('HDEL', meta, 'rest')
  -- A session set to expire keeps its keys' deadline (accept.lua takes it off all of them).
  local ttl = redis.call('PTTL', meta)
  if ttl > 0 then redis.call('PEXPIRE', log, ttl) end
end
