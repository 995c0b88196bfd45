#!lua flags=allow-oom
-- promote.lua: dispatch a tenant's oldest waiting executions into its free slots, at most
-- `budget` of them per call, so raising a limit over a long waiting set is many short steps
-- (continued by the caller until the reply is 0) instead of one long one.
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the tenant's limits (cfg)   KEYS[3]  its slot set      KEYS[4]  its waiting set
-- KEYS[5]  the shard's ready stream
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  tenant id
-- ARGV[7]  most waiting executions to handle in this call
--
-- Reply: 1 when more waiting executions fit now, else 0
local tenant = ARGV[6]
declared(2, K.cfg(tenant)); declared(3, K.slots(tenant)); declared(4, K.waiting(tenant))
declared(5, K.ready())
if promote(tenant, now_ms(), tonumber(ARGV[7])) then return 1 end
return 0
