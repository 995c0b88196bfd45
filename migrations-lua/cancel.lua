-- cancel.lua: cancel one execution of a tenant.
--   queued  -> 'cancelled' now: off its queue, slot released, oldest waiting dispatched.
--   running -> 'cancel_requested' set; the worker holding it stops it, and no path (retry
--              backoff, reclaim, release) runs it again: it ends cancelled.
--   terminal -> unchanged (cancel is idempotent).
--
-- KEYS[1]  the execution's row key (routing only)
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  the caller's tenant id
-- ARGV[7]  execution id
--
-- Reply: {'not_found'} (missing, or another tenant's) | {'ok', id, row}
local tenant, id = ARGV[6], ARGV[7]
local row = redis.call('HMGET', K.row(id), 'tenant', 'status', 'qstate', 'entry', 'flow',
  'deleted')
if row[1] ~= tenant or row[6] then return { 'not_found' } end
local status, qstate, entry, flow = row[2], row[3], row[4], row[5]

local now = now_ms()
if status == 'queued' then
  unqueue(tenant, id, qstate, entry, now)
  index_remove(tenant, flow, 'queued', id)
  index_add(tenant, flow, 'cancelled', id)
  redis.call('HSET', K.row(id), 'status', 'cancelled', 'cancel', 1, 'finished', now,
    'updated', now)
  redis.call('HDEL', K.row(id), 'qstate', 'entry')
  settle_terminal(tenant, id)
  redis.call('HINCRBY', K.stats(), 'cancelled', 1)
elseif status == 'running' then
  if redis.call('HGET', K.row(id), 'cancel') ~= '1' then
    redis.call('HSET', K.row(id), 'cancel', 1, 'updated', now)
  end
end
return { 'ok', id, hgetall(id) }
