-- cancel.lua: ask for the open turn (or, with none, the next waiting one) to be cancelled;
-- or, given a prompt's message id, that turn only, while it is open or waiting.
--
-- KEYS  1 meta (HASH)  2 lease  3 inbox (STREAM)  4 log  5 ui  6 msgs  7 pending (ZSET)
--       8 keys  9 ckpt  10 rest                                            -- one session, one slot
-- ARGV  1 now_ms  2 target message id ('' = the open turn, else the next waiting one)
-- Returns {"ok", target message id, inbox seq} | {"none"} | {"unknown"}
--
-- Invariant: the request lands in the inbox stream, which a running worker polls (XREAD
-- every 0.25 s, fxworker/watch.py), so it sees the cancel within a second; `cancel` in meta names the
-- target until that input is done, so a worker claiming later sees it too.

local meta, inbox, pending = KEYS[1], KEYS[3], KEYS[7]
if redis.call('EXISTS', meta) == 0 then return {'unknown'} end
local open = redis.call('HGET', meta, 'turn') or ''
local target = ARGV[2] or ''
if target ~= '' then
  -- One turn: the open one, or one still waiting; an ended (or unknown) one is left alone.
  if target ~= open and not redis.call('ZSCORE', pending, target) then return {'none'} end
elseif open ~= '' then
  target = open
else
  local first = redis.call('ZRANGE', pending, 0, 0)
  if #first == 0 then return {'none'} end
  target = first[1]
end
redis.call('HSET', meta, 'cancel', target)
local seq = redis.call('HINCRBY', meta, 'inbox', 1)
redis.call('XADD', inbox, seq .. '-0', 'k', 'c', 'id', target, 'at', ARGV[1])
return {'ok', target, seq}
