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
-- reading by hand). A parked turn's session with nothing waiting behind it keeps its
-- turn's input there too, as one more triple: `i<inbox seq>`, the entry's fields (items
-- again, field then value) and "". `fxworker.store._replies.parse_rest` reads the records
-- and skips the input.
--
-- rest_log(input_seq) -> the log's records go into `rest` (an empty log goes); with
--   input_seq, the inbox's entry `<input_seq>-0` goes there too and the inbox goes (a
--   parked turn's release, release.lua)
-- rest_pack() -> rest_log(), and the consumed inbox goes, and so do the fields of meta
--   only an open turn uses, which read as 0 or ""
-- rest_thaw() -> puts `rest` back into the log, and a parked turn's input back into the
--   inbox, first (nothing when `rest` does not exist)

local function rest_items(values)
  local out = {}
  for _, v in ipairs(values) do
    out[#out + 1] = #v .. ':'
    out[#out + 1] = v
  end
  return table.concat(out)
end

local function rest_log(input_seq)
  local meta, log, rest = KEYS[1], KEYS[4], KEYS[10]
  if redis.call('EXISTS', rest) == 1 then return end
  local records = redis.call('XRANGE', log, '-', '+')
  local input = {}
  if input_seq then input = redis.call('XRANGE', KEYS[3], input_seq .. '-0', input_seq .. '-0') end
  if #records > 0 or #input > 0 then
    local items = {}
    for _, e in ipairs(records) do
      local f = {}
      for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
      items[#items + 1] = string.match(e[1], '^(%d+)')
      items[#items + 1] = f.d or ''
      items[#items + 1] = f.e or ''
    end
    if #input > 0 then
      items[#items + 1] = 'i' .. input_seq
      items[#items + 1] = rest_items(input[1][2])
      items[#items + 1] = ''
      redis.call('DEL', KEYS[3])
    end
    redis.call('SET', rest, rest_items(items))
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
  local function items(text)
    local out, pos = {}, 1
    while pos <= #text do
      local colon = string.find(text, ':', pos, true)
      local n = tonumber(string.sub(text, pos, colon - 1))
      out[#out + 1] = string.sub(text, colon + 1, colon + n)
      pos = colon + n + 1
    end
    return out
  end
  local all = items(s)
  for k = 1, #all, 3 do
    local id, d, e = all[k], all[k + 1], all[k + 2]
    if string.sub(id, 1, 1) == 'i' then
      -- The parked turn's input goes back first: inputs accepted since are after it.
      local inbox = KEYS[3]
      local later = redis.call('XRANGE', inbox, '-', '+')
      redis.call('DEL', inbox)
      redis.call('XADD', inbox, string.sub(id, 2) .. '-0', unpack(items(d)))
      for _, entry in ipairs(later) do redis.call('XADD', inbox, entry[1], unpack(entry[2])) end
    else
      redis.call('XADD', log, id .. '-0', 'd', d, 'e', e)
    end
  end
  redis.call('DEL', rest)
  redis.call('HDEL', meta, 'rest')
  -- A session set to expire keeps its keys' deadline (accept.lua takes it off all of them).
  local ttl = redis.call('PTTL', meta)
  if ttl > 0 then redis.call('PEXPIRE', log, ttl) end
end
