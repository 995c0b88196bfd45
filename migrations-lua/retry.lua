-- retry.lua: re-queue a failed or cancelled execution under the same id with fresh attempts,
-- through the same quota decision as an admission (its dedup key still maps to it).
--
-- KEYS[1]  the execution's row key (routing only)
-- ARGV[1..4] common (see common.lua)
-- ARGV[5]  the caller's tenant id
-- ARGV[6]  execution id
--
-- Reply: {'not_found'} | {'not_retryable', status} | {'disabled'} | {'full', waiting}
--      | {'ok', id, row}
local tenant, id = ARGV[5], ARGV[6]
local row = redis.call('HMGET', K.row(id), 'tenant', 'status', 'flow')
if row[1] ~= tenant then return { 'not_found' } end
local status, flow = row[2], row[3]
if status ~= 'failed' and status ~= 'cancelled' then return { 'not_retryable', status } end

local max_concurrent, max_queued, enabled = limits(tenant)
if not enabled then return { 'disabled' } end
local qstate = 'dispatched'
if redis.call('SCARD', K.slots(tenant)) >= max_concurrent then
  local waiting = redis.call('ZCARD', K.waiting(tenant))
  if waiting >= max_queued then return { 'full', waiting } end
  qstate = 'waiting'
end

local now = now_ms()
redis.call('PERSIST', K.row(id))
redis.call('HDEL', K.row(id), 'started', 'finished', 'output', 'err_kind', 'err_msg', 'cancel')
redis.call('HSET', K.row(id), 'status', 'queued', 'qstate', qstate, 'attempt', 0, 'updated', now)
index_move(tenant, flow, status, 'queued', id)
if qstate == 'dispatched' then
  dispatch(tenant, id, now)
else
  redis.call('ZADD', K.waiting(tenant), now, id)
end
return { 'ok', id, hgetall(id) }
