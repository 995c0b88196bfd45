-- admit.lua: admit one execution, atomically: dedup claim, row, indexes, quota decision, enqueue.
--
-- KEYS[1]  the new execution's row key (routing only; rebuilt from ARGV[1])
-- ARGV[1..4] common (see common.lua)
-- ARGV[5]  tenant id (validated: no braces, colons or spaces)
-- ARGV[6]  new execution id (32 lowercase hex, minted by the caller)
-- ARGV[7]  flow id (validated key-safe)
-- ARGV[8]  version, '' for none
-- ARGV[9]  params, JSON text of an object
-- ARGV[10] max_attempts
-- ARGV[11] dedup key as given, '' for none
-- ARGV[12] digest of the dedup key: 128 bits of its SHA-256, hex ('' for none)
-- ARGV[13] request fingerprint (flow, version, params), hex
-- ARGV[14] dedup mapping TTL, seconds
--
-- Reply, one of:
--   {'new', qstate, now} admitted as 'dispatched' or 'waiting' at `now` (ms); the caller
--                       knows the rest of the row it asked for
--   {'dup', id, row}    the dedup key maps to live execution id, admitted with the same request
--   {'conflict', id}    the dedup key maps to id, admitted with a different request
--   {'disabled'}        the tenant is disabled; nothing written
--   {'full', waiting}   no free slot and the waiting set is at max_queued; nothing written
local tenant, id, flow, version, params = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local max_attempts, dedup, dedup_hash, fingerprint = ARGV[10], ARGV[11], ARGV[12], ARGV[13]
local dedup_ttl = tonumber(ARGV[14])

local dedup_key = nil
if dedup ~= '' then
  dedup_key = K.dedup(tenant, dedup_hash)
  local mapped = redis.call('GET', dedup_key)
  if mapped then
    local sep = string.find(mapped, ':', 1, true)
    local mapped_id, mapped_fp = string.sub(mapped, 1, sep - 1), string.sub(mapped, sep + 1)
    -- A mapping always has its row (both are written here and removed together); a missing
    -- row can only mean its retention ran out first, so the key is free again.
    if redis.call('EXISTS', K.row(mapped_id)) == 1 then
      if mapped_fp ~= fingerprint then return { 'conflict', mapped_id } end
      return { 'dup', mapped_id, hgetall(mapped_id) }
    end
  end
end

local max_concurrent, max_queued, enabled = limits(tenant)
if not enabled then return { 'disabled' } end

local slots = redis.call('SCARD', K.slots(tenant))
local qstate
if slots < max_concurrent then
  qstate = 'dispatched'
else
  local waiting = redis.call('ZCARD', K.waiting(tenant))
  if waiting >= max_queued then return { 'full', waiting } end
  qstate = 'waiting'
end

-- Decided; from here on only writes.
local now = now_ms()
local row = { 'tenant', tenant, 'flow', flow, 'params', params, 'status', 'queued',
  'qstate', qstate, 'attempt', 0, 'max_attempts', max_attempts, 'created', now, 'updated', now }
if version ~= '' then table.insert(row, 'version'); table.insert(row, version) end
if dedup ~= '' then table.insert(row, 'dedup'); table.insert(row, dedup) end
redis.call('HSET', K.row(id), unpack(row))
index_add(tenant, flow, 'queued', id)
-- Registries the sweeper walks (set members: repeated admissions cost nothing more).
redis.call('SADD', K.tenants(), tenant)
redis.call('SADD', K.flows(tenant), flow)
if qstate == 'dispatched' then
  dispatch(tenant, id, now)
else
  redis.call('ZADD', K.waiting(tenant), now, id)
end
if dedup_key then
  redis.call('SET', dedup_key, id .. ':' .. fingerprint, 'EX', dedup_ttl)
end
return { 'new', qstate, now }
