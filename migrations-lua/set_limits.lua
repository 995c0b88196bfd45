#!lua flags=allow-oom
-- set_limits.lua: change the limits a tenant's request names, keep the others, then put the
-- tenant in or out of the shard's runnable set (refresh() in common.lua): raising
-- max_concurrent lets its waiting executions start as slots are picked, in order; lowering it
-- stops new starts until enough running ones end (none is stopped).
--
-- A new weight counts from the tenant's next start: its virtual time so far stays.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  cfg: the tenant's limits
-- KEYS[3]  slots: its slot set
-- KEYS[4]  waiting: its queue
-- KEYS[5]  runnable: the shard's runnable tenants
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  max_concurrent: a number, '' to keep the current value, 'default' for the server's
-- ARGV[8]  max_queued: likewise
-- ARGV[9]  enabled: '1' / '0', '' to keep, 'default' (enabled)
-- ARGV[10] weight: 1..1000, '' to keep, 'default' (1)
-- ARGV[11] max_concurrent_per_key: as max_concurrent ('default': none). A raised one lets
--          blocked keys start as the caller continues with promote.lua; a lowered one takes
--          effect at each key's next start (start_entries() checks the key before it starts
--          anything).
-- ARGV[12] rate: '<starts>:<per ms>:<burst>', '' to keep, 'default' for none (see "Rate
--          limits" in common.lua)
-- ARGV[13] key_rate: the same for each concurrency key
-- ARGV[14] max_bytes: as max_concurrent (see "Storage" in common.lua)
-- ARGV[15] max_retained: likewise
--
-- Reply: 0; 1 when the tenant is being deleted (tenant_drop.lua; registered again only once
-- tenant_reap.lua is done): nothing written; -1 - n when the tenant is pinned to dedicated
-- shard n (pin.lua): nothing written
local tenant = ARGV[6]
local CFG = declared(2, K.cfg(tenant))
declared(3, K.slots(tenant)); declared(4, K.waiting(tenant)); declared(5, K.runnable())
local state = redis_call('HMGET', CFG, 'pinned', 'deleting')
if state[1] then return -1 - tonumber(state[1]) end
if state[2] then return 1 end
local values = { max_concurrent = ARGV[7], max_queued = ARGV[8], enabled = ARGV[9],
  weight = ARGV[10], max_concurrent_per_key = ARGV[11], rate = ARGV[12],
  key_rate = ARGV[13], max_bytes = ARGV[14], max_retained = ARGV[15] }
local _, _, _, _, old_weight = limits(tenant)
-- The field 'configured' keeps the hash in existence, which marks the tenant as known.
redis_call('HSET', CFG, 'configured', 1)
for field, value in pairs(values) do
  if value == 'default' then
    redis_call('HDEL', CFG, field)
  elseif value ~= '' then
    redis_call('HSET', CFG, field, value)
  end
end
-- The shard's eligible weight counts the tenant's weight while it is runnable. (Its limits
-- are read again: the ones this call read before the writes are gone.)
LIMITS_READ[tenant] = nil
local _, _, _, _, weight = limits(tenant)
if weight ~= old_weight and redis_call('ZSCORE', K.runnable(), tenant) then
  redis_call('HINCRBY', K.sched(), 'weight', weight - old_weight)
end
refresh(tenant)
return 0
