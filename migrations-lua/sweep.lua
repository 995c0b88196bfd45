#!lua flags=allow-oom
-- sweep.lua: one batch of repairs for one tenant, walking one structure with a SCAN cursor.
-- These repair what should never drift (a crash between Redis and a lost reply cannot cause it,
-- but retention expiry and manual edits can).
--
--   mode 'slots'   slot-set members whose execution is terminal or gone: removed, and any
--                  room given to the oldest waiting executions
--   mode 'waiting' waiting-set members whose execution is gone or no longer waiting: removed
--   mode 'index'   status/flow index members whose row expired or moved on: removed
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the shard's counters        KEYS[3]  the tenant's limits (cfg)
-- KEYS[4]  its slot set                KEYS[5]  its waiting set
-- KEYS[6]  the shard's ready stream
-- KEYS[7]  mode 'index': the index walked (the tenant's status index, or its flow's)
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
declared(6, K.ready())
local now = now_ms()
local repaired = 0

-- Every repair is counted per shard (see the queue statistics).
local function counted(reply)
  if reply[2] > 0 then redis.call('HINCRBY', STATS, 'repaired_' .. mode, reply[2]) end
  return reply
end

if mode == 'slots' then
  local r = redis.call('SSCAN', SLOTS, cursor, 'COUNT', count)
  for _, id in ipairs(r[2]) do
    local st = redis.call('HGET', K.row(id), 'status')
    if st ~= 'queued' and st ~= 'running' then
      redis.call('SREM', SLOTS, id)
      repaired = repaired + 1
    end
  end
  -- Room may also be left by an interrupted limit change: give it to the oldest waiting.
  promote(tenant, now, PROMOTE_BUDGET)
  return counted({ r[1], repaired })
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
  idx = declared(7, idx)
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
