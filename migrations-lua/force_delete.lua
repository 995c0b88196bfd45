-- force_delete.lua: terminalize and delete one execution now, whatever its state: off its
-- queue, slot released (oldest waiting dispatched), indexes cleaned, dedup key released (only
-- if it still maps to this execution), row deleted. The same dedup key then admits a new id.
--
-- KEYS[1]  the execution's row key (routing only)
-- ARGV[1..4] common (see common.lua)
-- ARGV[5]  the caller's tenant id
-- ARGV[6]  execution id
-- ARGV[7]  digest of the row's dedup key (as in admit.lua), '' when it has none
--
-- Reply: {'not_found'} (missing, or another tenant's) | {'deleted'}
local tenant, id, dedup_hash = ARGV[5], ARGV[6], ARGV[7]
local row = redis.call('HMGET', K.row(id), 'tenant', 'status', 'qstate', 'entry', 'flow')
if row[1] ~= tenant then return { 'not_found' } end
local status, qstate, entry, flow = row[2], row[3], row[4], row[5]

local now = now_ms()
if status == 'queued' then
  unqueue(tenant, id, qstate, entry, now)
else
  -- running (or a terminal row whose release already happened: SREM makes this a no-op).
  -- The holder's completion will find no row and be refused; its entry is acknowledged now.
  if status == 'running' then drop_entry(entry) end
  release_slot(tenant, id, now)
end
index_remove(tenant, flow, status, id)
if dedup_hash ~= '' then
  local key = K.dedup(tenant, dedup_hash)
  local mapped = redis.call('GET', key)
  if mapped and string.sub(mapped, 1, #id + 1) == id .. ':' then
    redis.call('DEL', key)
  end
end
redis.call('ZREM', K.leases(), id)
redis.call('DEL', K.row(id))
return { 'deleted' }
