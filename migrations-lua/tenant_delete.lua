-- tenant_delete.lua: remove a tenant from the registry and revoke all its API keys, in one
-- step. Its executions and limits live in its shard and are handled by the caller.
--
-- KEYS[1]  the tenant registry, sluice:{acl}:tenants
-- KEYS[2]  the tenant's key set, sluice:{acl}:t:<tenant>:keys
-- ARGV[1]  the access prefix, sluice:{acl}: (key records are built from it)
-- ARGV[2]  tenant id
--
-- Reply: the number of keys revoked, or -1 when the tenant was not registered.
local existed = redis.call('ZREM', KEYS[1], ARGV[2])
local ids = redis.call('SMEMBERS', KEYS[2])
for _, id in ipairs(ids) do redis.call('DEL', ARGV[1] .. 'key:' .. id) end
redis.call('DEL', KEYS[2])
if existed == 0 then return -1 end
return #ids
