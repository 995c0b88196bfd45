#!lua flags=allow-oom
-- force_delete.lua: terminalize and delete one execution now, whatever its state: off its
-- queue, indexes cleaned, dedup key released (only if it still maps to this execution), row
-- gone for every reader. The same dedup key then admits a new id.
--
-- A running execution keeps its slot until its handler has stopped (the worker holding it is
-- told at once, see tell_holder in common.lua, and its heartbeat answers 'cancel'; its report
-- then frees the slot) or its lease has expired
-- (reclaim.lua frees it): the quota counts handlers actually running. Until then its row stays
-- hidden, marked `deleted` (every read treats it as missing), and listed in the tenant's
-- `deleting` set so that usage still counts it as running.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  row: the execution's row
-- KEYS[3]  cfg: the tenant's limits
-- KEYS[4]  slots: its slot set
-- KEYS[5]  waiting: its queue
-- KEYS[6]  deleting: its force-deleted set
-- KEYS[7]  runnable: the shard's runnable tenants
-- KEYS[8]  delayed: its timer set
-- KEYS[9]  leases: its lease index
-- The execution's logical bytes leave its tenant's count at once, and a terminal one leaves
-- its expiry bucket (see "Storage" in common.lua); a running one's row, kept hidden until its
-- handler stops, is counted no more.
-- (The tenant's webhook outbox, if it has a webhook, and its expiry buckets are named inside:
-- see common.lua.)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: the caller's tenant id
-- ARGV[7]  id: execution id
--
-- Reply: {'not_found'} (missing, another tenant's, or deleted already) | {'deleted'}
local tenant, id = ARGV[6], ARGV[7]
local ROW = declared(2, K.row(id))
declared(3, K.cfg(tenant)); declared(4, K.slots(tenant)); declared(5, K.waiting(tenant))
local DELETING = declared(6, K.deleting(tenant))
declared(7, K.runnable()); declared(8, K.delayed())
local LEASES = declared(9, K.leases())
local row = redis_call('HMGET', ROW, 't', 's', 'q', 'e', 'f', 'dh',
  'dl', 'kh', 'z')
if row[1] ~= tenant or row[7] then return { 'not_found' } end
local status, qstate, entry, flow, digest = row[2], row[3], row[4], row[5], row[6]

local now = now_ms()
local sz = tonumber(row[9])
if sz then
  local size = sz + redis_call('HSTRLEN', ROW, 'o') + redis_call('HSTRLEN', ROW, 'em')
  count_bytes(tenant, -size)
  if status ~= 'queued' and status ~= 'running' then
    local expire_at = redis_call('PEXPIRETIME', ROW)
    if expire_at > 0 then retain(tenant, size, expire_at, -1) end
  end
end
notify_deleted(id, now)
local attempt = redis_call('HGET', ROW, 'a') or '0'
outbox(tenant, id, 'deleted', now, { 'flow', flow, 'attempt', attempt, 'was', status })
index_remove(tenant, flow, status, id)
if digest then dedup_release(tenant, id, digest) end
if status == 'running' then
  redis_call('HSET', ROW, 'dl', 1, 'u', now)
  redis_call('SADD', DELETING, id)
  tell_holder(redis_call('HGET', ROW, 'lo'), id)
  flush_usage()
  return { 'deleted' }
end
if status == 'queued' then
  unqueue(tenant, flow, id, qstate, row[8])
else
  -- Terminal: its release already happened (SREM makes this a no-op).
  release_slot(tenant, id, row[8])
end
redis_call('ZREM', LEASES, id)
redis_call('DEL', ROW)
flush_usage()
return { 'deleted' }
