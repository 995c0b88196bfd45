#!lua flags=allow-oom
-- promote.lua: after a tenant's limits changed, put it in or out of its shard's runnable set
-- (refresh() in common.lua) and let its concurrency keys that were at their limit take what
-- room the change made. Executions start when they are picked, so a raised tenant limit only
-- has to make the tenant eligible again — one O(log n) step however long its queue is. A raised
-- (or removed) key limit lets each blocked key (K.key_blocked(t)) offer its first execution
-- to the tenant's order (key_offer()): walked in batches with a SCAN cursor, so a tenant with
-- many blocked keys costs several short calls, never one long one.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  cfg: the tenant's limits
-- KEYS[3]  slots: its slot set
-- KEYS[4]  waiting: its queue
-- KEYS[5]  runnable: the shard's runnable tenants
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  cursor: where the walk over the tenant's blocked keys goes on ('0' to begin)
--
-- Reply: the next cursor ('0' when the walk is done)
local tenant = ARGV[6]
declared(2, K.cfg(tenant)); declared(3, K.slots(tenant)); declared(4, K.waiting(tenant))
declared(5, K.runnable())
local r = redis_call('SSCAN', K.key_blocked(tenant), ARGV[7], 'COUNT', 200)
for _, h in ipairs(r[2]) do key_offer(tenant, h) end
refresh(tenant)
return r[1]
