#!lua flags=allow-oom
-- sweep.lua: one batch of repairs for one tenant, walking one structure with a SCAN cursor.
-- These repair what should never drift (a crash between Redis and a lost reply cannot cause it,
-- but retention expiry and manual edits can).
--
--   mode 'slots'   slot-set members whose execution is terminal or gone: removed, and any
--                  room given to the oldest waiting executions; members dispatched whose
--                  stream entry is gone (a lost or replaced ready stream): put back on it
--   mode 'waiting' waiting-set members whose execution is gone or no longer waiting: removed
--   mode 'index'   status/flow index members whose row expired or moved on: removed
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the shard's counters        KEYS[3]  the tenant's limits (cfg)
-- KEYS[4]  its slot set                KEYS[5]  its waiting set
-- KEYS[6]  the shard's ready stream   KEYS[7]  the shard's lease index
-- KEYS[8]  mode 'index': the index walked (the tenant's status index, or its flow's)
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  tenant id
-- ARGV[7]  mode
-- ARGV[8]  status (mode 'index')
-- ARGV[9]  flow, '' for the status index itself (mode 'index')
-- ARGV[10]  cursor ('0' to begin)
-- ARGV[11] batch size hint
--
-- Reply: {next_cursor ('0' when done), repaired}
local tenant, mode, status, flow = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local cursor, count = ARGV[10], ARGV[11]
local STATS = declared(2, K.stats())
declared(3, K.cfg(tenant))
local SLOTS, WAITING = declared(4, K.slots(tenant)), declared(5, K.waiting(tenant))
local READY, LEASES = declared(6, K.ready()), declared(7, K.leases())
local now = now_ms()
local repaired = 0

-- Every repair is counted per shard (see the queue statistics).
local function counted(reply)
  if reply[2] > 0 then redis.call('HINCRBY', STATS, 'repaired_' .. mode, reply[2]) end
  return reply
end

-- Whether a dispatched execution's stream entry is lost: not on the ready stream, not in the
-- group's pending list, and no lease. A start reads the entry and marks the row running in one
-- script, so a row still 'queued' whose entry is nowhere was not taken by any worker: nothing
-- else will ever run it.
local function entry_lost(id, entry)
  if redis.call('ZSCORE', LEASES, id) then return false end
  if not entry or entry == '' then return true end
  if #redis.call('XRANGE', READY, entry, entry) > 0 then return false end
  -- No stream or no group (a NOGROUP error, a table without array part): nothing pending.
  local pending = redis.pcall('XPENDING', READY, GROUP, entry, entry, 1)
  return pending.err ~= nil or #pending == 0
end

if mode == 'slots' then
  local r = redis.call('SSCAN', SLOTS, cursor, 'COUNT', count)
  local requeued = 0
  for _, id in ipairs(r[2]) do
    local row = redis.call('HMGET', K.row(id), 'status', 'qstate', 'entry')
    local st = row[1]
    if st ~= 'queued' and st ~= 'running' then
      redis.call('SREM', SLOTS, id)
      repaired = repaired + 1
    elseif st == 'queued' and row[2] == 'dispatched' and entry_lost(id, row[3]) then
      -- A stream that was lost comes back with its group (the entry must be readable).
      redis.pcall('XGROUP', 'CREATE', READY, GROUP, '0', 'MKSTREAM')
      dispatch_entry(id, now)
      requeued = requeued + 1
    end
  end
  if requeued > 0 then redis.call('HINCRBY', STATS, 'repaired_lost_entries', requeued) end
  -- Room may also be left by an interrupted limit change: give it to the oldest waiting.
  promote(tenant, now, PROMOTE_BUDGET)
  local reply = counted({ r[1], repaired })
  reply[2] = reply[2] + requeued
  return reply
elseif mode == 'waiting' then
  local r = redis.call('ZSCAN', WAITING, cursor, 'COUNT', count)
  for i = 1, #r[2], 2 do
    local id = r[2][i]
    local row = redis.call('HMGET', K.row(id), 'status', 'qstate')
    if row[1] ~= 'queued' or row[2] ~= 'waiting' then
      redis.call('ZREM', WAITING, id)
      repaired = repaired + 1
    end
  end
  return counted({ r[1], repaired })
else
  local idx
  if flow == '' then idx = K.status_idx(tenant, status) else idx = K.flow_idx(tenant, flow, status) end
  idx = declared(8, idx)
  local r = redis.call('ZSCAN', idx, cursor, 'COUNT', count)
  for i = 1, #r[2], 2 do
    local id = r[2][i]
    if redis.call('HGET', K.row(id), 'status') ~= status then
      redis.call('ZREM', idx, id)
      repaired = repaired + 1
    end
  end
  return counted({ r[1], repaired })
end
