#!lua flags=allow-oom
-- promote.lua: put a tenant in or out of its shard's runnable set after its limits changed
-- (refresh() in common.lua): executions start when they are picked, so raising a limit only
-- has to make the tenant eligible again — one O(log n) step however long its queue is. Kept as
-- its own call for the callers that continue a limit change (set_limits.lua does the same).
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the tenant's limits (cfg)   KEYS[3]  its slot set      KEYS[4]  its queue
-- KEYS[5]  the shard's runnable tenants
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  tenant id
-- ARGV[7]  unused (kept for callers of the stream model, which dispatched in batches)
--
-- Reply: 0 (nothing is left to continue)
local tenant = ARGV[6]
declared(2, K.cfg(tenant)); declared(3, K.slots(tenant)); declared(4, K.waiting(tenant))
declared(5, K.runnable())
refresh(tenant)
return 0
