#!lua
-- retry.lua: re-queue a failed or cancelled execution under the same id with fresh attempts,
-- through the same quota decision as an admission (place() in common.lua), runnable at once in
-- its tenant's order by the time of the retry and its priority. Its dedup key still maps to it and stops expiring until it is
-- terminal again (its mapping back in its bucket: dedup_revive() in common.lua). `attempt` starts over; the fence does not (the next start takes the next
-- fence), so a worker still holding a run from before the retry can never pass for the new one.
--
-- Storage (see "Storage" in common.lua): the row leaves the retained rows and its expiry
-- bucket, and its output and error message leave its tenant's bytes; it adds nothing. So the
-- storage decision is an admission's on what is left after that: a retry is refused only
-- while the tenant is over a bound even so (a bound lowered under its usage). A row an older
-- build admitted (no `sz`) is counted from its retry on, and adds its size.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  row: the execution's row
-- KEYS[3]  cfg: the tenant's limits
-- KEYS[4]  slots: its slot set
-- KEYS[5]  waiting: its queue
-- KEYS[6]  listing: its listing (K.listing() in common.lua)
-- KEYS[7]  runnable: the shard's runnable tenants
-- (The tenant goes back in the shard's busy set, and its expiry buckets change: names built
-- inside, see common.lua.)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: the caller's tenant id
-- ARGV[7]  id: execution id
-- ARGV[8]  max_bytes: the server's max_bytes (for a tenant without its own)
-- ARGV[9]  max_retained: the server's max_retained (likewise)
--
-- Reply: {'not_found'} | {'not_retryable', status} | {'disabled'} | {'deleting'}
--      | {'full', queued}
--      | {'storage_full', bound, count, limit, wait_ms} (see storage_refusal() in common.lua)
--      | {'ok', id, row}
local tenant, id = ARGV[6], ARGV[7]
local ROW = declared(2, K.row(id))
declared(3, K.cfg(tenant)); declared(4, K.slots(tenant)); declared(5, K.waiting(tenant))
declared(6, K.listing(tenant))
declared(7, K.runnable())
local row = redis_call('HMGET', ROW, 't', 's', 'f', 'dh', 'dl', 'pr',
  'kh', 'z')
if row[1] ~= tenant or row[5] then return { 'not_found' } end
local status, flow, digest = row[2], row[3], row[4]
if status ~= 'failed' and status ~= 'cancelled' then return { 'not_retryable', status } end

local now = now_ms()
local ok, refusal, queued = place(tenant)
if not ok then return { refusal, queued } end
-- What the retry frees (a counted row) or adds (a row not counted yet).
local sz, size, grow, expire_at = tonumber(row[8]), nil, 0, -1
local fields = { 's', 'queued', 'a', 0, 'u', now }
if sz then
  local dropped = redis_call('HSTRLEN', ROW, 'o') + redis_call('HSTRLEN', ROW, 'em')
  size, grow = sz + dropped, -dropped
  expire_at = redis_call('PEXPIRETIME', ROW)
else
  sz = ROW_BYTES + redis_call('HSTRLEN', ROW, 'p')
  grow = sz
  table.insert(fields, 'z')
  table.insert(fields, sz)
end
local full = storage_refusal(tenant, grow, expire_at > 0 and -1 or 0, now, ARGV[8], ARGV[9])
if full then return full end

redis_call('PERSIST', ROW)
if digest then dedup_revive(tenant, id, digest) end
redis_call('HDEL', ROW, 'st', 'fi', 'o', 'ek', 'em', 'x', 'ra')
index_move(tenant, flow, status, 'queued', id)
make_runnable(tenant, id, now, row[6], fields, row[7])
mark_busy(tenant)
count_bytes(tenant, grow)
if size and expire_at > 0 then retain(tenant, size, expire_at, -1) end
flush_usage()
notify(id, now)
return { 'ok', id, view(id) }
