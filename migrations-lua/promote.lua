-- promote.lua: dispatch a tenant's oldest waiting executions into its free slots, at most
-- `budget` of them per call, so raising a limit over a long waiting set is many short steps
-- (continued by the caller until the reply is 0) instead of one long one.
--
-- KEYS[1]  the tenant's config key (routing only)
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  tenant id
-- ARGV[7]  most waiting executions to handle in this call
--
-- Reply: 1 when more waiting executions fit now, else 0
if promote(ARGV[6], now_ms(), tonumber(ARGV[7])) then return 1 end
return 0
