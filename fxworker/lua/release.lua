-- release.lua: let a session go; optionally count a deadline cut-off of its open step.
--
-- KEYS  1 meta (HASH)  2 lease (HASH)  3 inbox  4 log  5 ui  6 msgs  7 pending (ZSET)
--       8 keys  9 ckpt  10 rest                                            -- one session, one slot
--       11 ready (ZSET)             -- optional: standalone Redis only ({~index} slot)
-- ARGV  1 epoch   2 cutoff ("1" the deadline cut off the open step)   3 now_ms
--       4 ttl_ms ("0" keeps finished sessions)   5 session id (the ready set's member)
--       6 newer: "" or a layout level; the holder met a stored layout it cannot read, so
--         only a process reading that level may claim the session next (meta `newer`,
--         claim.lua); nothing of it is ended
--       7 "1": a parked turn's input may wait in `rest` with its log when nothing waits
--         behind it (every live process reads stored layout 2: a process of the previous
--         release would take the session for one with its inbox gone, `_whole.lua`)
-- Returns {"ok", released_now(0|1), cutoffs, pending} | {"fenced", lease_epoch, lease_state, lease_expires_ms}
--   pending: inputs still waiting at the release (one accepted while the lease was held
--   found it held, so its wake did nothing: the releaser wakes the session again).
--
-- Invariant: only the epoch's own holder releases, once: a second release of the same
-- epoch changes nothing (and counts no second cut-off). A holder whose lease expired but
-- was not claimed again still heads the chain and may release it. The epoch stays, so the
-- next claim is epoch + 1. Given KEYS[11], a release that leaves nothing to run (no turn
-- open, no input waiting) takes the session out of the ready set: on one server an accept
-- marks it in the same script that stores the input, so no mark of work still to come is
-- lost, and the sweeper does not read finished sessions again. Such a release also drops
-- the consumed inbox and the idempotency keys, moves the log into one value (_rest.lua)
-- and rewrites the lines to their size while they are few (_at_rest.lua). A release of a
-- parked turn (its calls wait for decisions, none has come, no cancel names it: `paused`,
-- append.lua) takes it out of the ready set too and answers pending 0: the inputs queued
-- behind it cannot run, and the decision or cancel that can wakes it (accept.lua,
-- cancel.lua); it is stored as a session at rest is, but for its turn's input and the
-- inputs behind it (_at_rest.lua, `parked`); a cancel of it that came while the lease was held counts as waiting, so
-- the releaser wakes the session for it. Only a process reading PARKED_LEVEL claims a
-- session with a turn parked next (meta `newer`).

-- include: _rest.lua
-- include: _at_rest.lua

local PARKED_LEVEL = 2  -- as append.lua's

local meta, lease, pending = KEYS[1], KEYS[2], KEYS[7]
local epoch, ttl_ms = tonumber(ARGV[1]), tonumber(ARGV[4])
local l = redis.call('HMGET', lease, 'epoch', 'state', 'expires_ms')
if tonumber(l[1] or 0) ~= epoch then
  return {'fenced', tonumber(l[1] or 0), l[2] or '', tonumber(l[3] or 0)}
end
local m = redis.call('HMGET', meta, 'turn', 'cutoffs', 'paused', 'decisions', 'cancel', 'turn_seq')
local cutoffs = tonumber(m[2] or 0)
local waiting = redis.call('ZCARD', pending)
if l[2] ~= 'held' then return {'ok', 0, cutoffs, waiting} end
redis.call('HSET', lease, 'state', 'released', 'expires_ms', 0)
if (ARGV[6] or '') ~= '' then redis.call('HSET', meta, 'newer', ARGV[6]) end
local turn = m[1] or ''
if ARGV[2] == '1' and turn ~= '' then cutoffs = redis.call('HINCRBY', meta, 'cutoffs', 1) end
if turn == '' and waiting == 0 then
  at_rest(ttl_ms, KEYS[11], ARGV[5])
elseif (m[3] or '') ~= '' then
  if m[5] == turn then
    waiting = waiting + 1  -- a cancel of the parked turn came while held: wake for it
  elseif tonumber(m[4] or 0) == 0 then
    parked(KEYS[11], ARGV[5], tonumber(m[6] or 0), ARGV[7] == '1')
    waiting = 0
  end
  redis.call('HSET', meta, 'newer', math.max(tonumber(ARGV[6] or '') or 0, PARKED_LEVEL))
end
return {'ok', 1, cutoffs, waiting}
