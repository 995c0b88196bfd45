#!lua flags=allow-oom
-- key_limit.lua: set or drop the override of one concurrency key's limit (how many of the
-- tenant's executions with that key run at once; see "Concurrency keys" in common.lua), then
-- let the key take what room a raise made (key_offer()) and put its tenant in or out of the
-- runnable set. A lowered limit stops new starts of the key until enough running ones end
-- (none is stopped).
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  cfg: the tenant's limits
-- KEYS[3]  key_limits: its key overrides
-- KEYS[4]  key_blocked: its blocked keys
-- KEYS[5]  key_queue: the key's queue
-- KEYS[6]  key_running: the key's running set
-- KEYS[7]  waiting: the tenant's queue
-- KEYS[8]  runnable: the shard's runnable tenants
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  digest: the key's digest
-- ARGV[8]  key: the key as given
-- ARGV[9]  limit: its limit (0..), '' to drop the override
-- ARGV[10] most: the most overrides a tenant may have
--
-- Reply: {'ok', running, queued} | {'too_many', overrides} (nothing written)
--      | {'moved', n} (the tenant is pinned to dedicated shard n: nothing written)
--      | {'deleting'} (the tenant is being deleted, see tenant_drop.lua: nothing written)
local tenant, h, key, limit = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local CFG = declared(2, K.cfg(tenant))
local OVERRIDES = declared(3, K.key_limits(tenant))
declared(4, K.key_blocked(tenant))
local QUEUE, RUNNING = declared(5, K.key_queue(tenant, h)), declared(6, K.key_running(tenant, h))
declared(7, K.waiting(tenant)); declared(8, K.runnable())
local state = redis_call('HMGET', CFG, 'pinned', 'deleting')
if state[1] then return { 'moved', state[1] } end
if state[2] then return { 'deleting' } end
if limit == '' then
  redis_call('HDEL', OVERRIDES, h)
else
  if redis_call('HEXISTS', OVERRIDES, h) == 0 then
    local n = redis_call('HLEN', OVERRIDES)
    if n >= tonumber(ARGV[10]) then return { 'too_many', n } end
  end
  redis_call('HSET', OVERRIDES, h, limit .. ':' .. key)
end
-- A lowered limit takes the key's entry out of its tenant's order now (a raised one puts it
-- in): the key's first execution is in that order exactly while the key has room.
local first = redis_call('ZRANGE', QUEUE, 0, 0)[1]
if first and not key_open(tenant, h) then
  redis_call('ZREM', K.waiting(tenant), first)
end
key_offer(tenant, h)
refresh(tenant)
return { 'ok', redis_call('SCARD', RUNNING), redis_call('ZCARD', QUEUE) }
