#!lua
-- retry.lua: re-queue a failed or cancelled execution under the same id with fresh attempts,
-- through the same quota decision as an admission (place() in common.lua), runnable at once in
-- its tenant's order by the time of the retry and its priority. Its dedup key still maps to it and stops expiring until it is
-- terminal again. `attempt` starts over; the fence does not (the next start takes the next
-- fence), so a worker still holding a run from before the retry can never pass for the new one.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  row: the execution's row
-- KEYS[3]  cfg: the tenant's limits
-- KEYS[4]  slots: its slot set
-- KEYS[5]  waiting: its queue
-- KEYS[6]  queued: its 'queued' status index
-- KEYS[7]  runnable: the shard's runnable tenants
-- (The tenant goes back in the shard's busy set, built inside: common.lua, trends.)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: the caller's tenant id
-- ARGV[7]  id: execution id
--
-- Reply: {'not_found'} | {'not_retryable', status} | {'disabled'} | {'deleting'}
--      | {'full', queued}
--      | {'ok', id, row}
local tenant, id = ARGV[6], ARGV[7]
local ROW = declared(2, K.row(id))
declared(3, K.cfg(tenant)); declared(4, K.slots(tenant)); declared(5, K.waiting(tenant))
local QUEUED_IDX = declared(6, K.status_idx(tenant, 'queued'))
declared(7, K.runnable())
local row = redis.call('HMGET', ROW, 'tenant', 'status', 'flow', 'ddh', 'deleted', 'priority',
  'ckh')
if row[1] ~= tenant or row[5] then return { 'not_found' } end
local status, flow, digest = row[2], row[3], row[4]
if status ~= 'failed' and status ~= 'cancelled' then return { 'not_retryable', status } end

local now = now_ms()
local ok, refusal, queued = place(tenant)
if not ok then return { refusal, queued } end

redis.call('PERSIST', ROW)
if digest then
  local key = K.dedup(tenant, digest)
  local mapped = redis.call('GET', key)
  if mapped and string.sub(mapped, 1, #id + 1) == id .. ':' then redis.call('PERSIST', key) end
end
redis.call('HDEL', ROW, 'started', 'finished', 'output', 'err_kind', 'err_msg', 'cancel',
  'run_at')
index_remove(tenant, flow, status, id)
redis.call('ZADD', QUEUED_IDX, 0, id)
redis.call('ZADD', K.flow_idx(tenant, flow, 'queued'), 0, id)
make_runnable(tenant, id, now, row[6], { 'status', 'queued', 'attempt', 0, 'updated', now },
  row[7])
mark_busy(tenant)
notify(id, now)
return { 'ok', id, view(id) }
