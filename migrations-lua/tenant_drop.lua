#!lua flags=allow-oom
-- tenant_drop.lua: the first step of deleting a tenant, in its shard: mark it as being deleted
-- (its cfg's `deleting`, the time the deletion began) and list it in the shard's set of
-- tenants being deleted, where tenant_reap.lua and the sweeper find it. From this call on the
-- tenant admits nothing (place() in common.lua refuses with 'deleting': admissions, retries,
-- dry runs), starts nothing (refresh() keeps it out of the runnable set, and it leaves that
-- set here), takes no new limits (set_limits.lua), concurrency-key override (key_limit.lua)
-- or webhook (webhook.lua), and cannot be pinned; its webhook goes now, with the events not
-- delivered yet (a deleted tenant's receiver is told nothing more). What it holds is removed
-- by tenant_reap.lua, in bounded steps; only then does the mark go, and the id can be
-- registered again with nothing of the old tenant left.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  cfg: the tenant's limits (the mark is a field of it)
-- KEYS[3]  reaping: the shard's tenants being deleted
-- KEYS[4]  runnable: the shard's runnable tenants
-- KEYS[5]  outbox: the tenant's webhook outbox
-- KEYS[6]  webhooks: the shard's tenants with a webhook
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- (Also read, names built inside from the tenant id: what tells whether it holds anything
-- here; and written, the shard's fair-share bookkeeping.)
-- ARGV[7]  registered: '1' when the registry lists the tenant (then it is marked even if it
--          holds nothing here), '0' otherwise
--
-- Reply: {'marked', since}   marked now (since: now, ms)
--      | {'deleting', since} marked before (by an earlier call; repeated, it changes nothing
--                            but the set membership it repairs)
--      | {'unknown'}         neither registered nor anything of it here: nothing written
--      | {'moved', n}        the tenant is pinned to dedicated shard n: nothing written
local tenant = ARGV[6]
local CFG = declared(2, K.cfg(tenant))
local REAPING = declared(3, K.reaping())
local RUNNABLE = declared(4, K.runnable())
local BOX = declared(5, K.outbox(tenant))
local HOOKED = declared(6, K.webhooks())
local v = redis_call('HMGET', CFG, 'pinned', 'deleting')
if v[1] then return { 'moved', v[1] } end
if v[2] then
  redis_call('SADD', REAPING, tenant)
  return { 'deleting', v[2] }
end
-- Anything of it here: its settings, the flows it ever admitted, executions (the force-deleted
-- ones included), dead letters (which outlive their rows).
if ARGV[7] ~= '1' and redis_call('EXISTS', CFG, K.flows(tenant), K.deleting(tenant),
  K.tenant_dlq(tenant), K.listing(tenant)) == 0 then
  return { 'unknown' }
end

local now = now_ms()
local vt = redis_call('ZSCORE', RUNNABLE, tenant)
if vt then leave(tenant, tonumber(vt), select(5, limits(tenant))) end
-- No fair-share credit is kept for a tenant that will not come back as itself.
redis_call('HDEL', K.sched(), 'vt:' .. tenant)
redis_call('HSET', CFG, 'deleting', now)
redis_call('HDEL', CFG, 'wh_url', 'wh_secret', 'wh_at')
redis_call('DEL', BOX)
redis_call('SREM', HOOKED, tenant)
redis_call('SADD', REAPING, tenant)
return { 'marked', now }
