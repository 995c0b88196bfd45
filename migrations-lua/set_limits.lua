#!lua flags=allow-oom
-- set_limits.lua: change the limits a tenant's request names, keep the others, then dispatch
-- waiting executions into any room a raised max_concurrent made (oldest first, bounded; the
-- caller continues with promote.lua while the reply says more fit).
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the tenant's limits (cfg)   KEYS[3]  its slot set      KEYS[4]  its waiting set
-- KEYS[5]  the shard's ready stream
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  tenant id
-- ARGV[7]  max_concurrent: a number, '' to keep the current value, 'default' for the server's
-- ARGV[8]  max_queued: likewise
-- ARGV[9]  enabled: '1' / '0', '' to keep, 'default' (enabled)
-- ARGV[10] most waiting executions to handle in this call
--
-- Reply: 1 when more waiting executions fit now (call promote.lua), else 0; -1 - n when the
-- tenant is pinned to dedicated shard n (pin.lua): nothing written
local tenant = ARGV[6]
local CFG = declared(2, K.cfg(tenant))
declared(3, K.slots(tenant)); declared(4, K.waiting(tenant)); declared(5, K.ready())
local budget = tonumber(ARGV[10])
local pinned = redis.call('HGET', CFG, 'pinned')
if pinned then return -1 - tonumber(pinned) end
local values = { max_concurrent = ARGV[7], max_queued = ARGV[8], enabled = ARGV[9] }
-- The field 'configured' keeps the hash in existence, which marks the tenant as known.
redis.call('HSET', CFG, 'configured', 1)
for field, value in pairs(values) do
  if value == 'default' then
    redis.call('HDEL', CFG, field)
  elseif value ~= '' then
    redis.call('HSET', CFG, field, value)
  end
end
if promote(tenant, now_ms(), budget) then return 1 end
return 0
