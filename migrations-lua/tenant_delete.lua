#!lua flags=allow-oom
-- tenant_delete.lua: remove a tenant from the registry and revoke all its API keys, in one
-- step. Its executions and limits live in its shard and are handled by the caller.
--
-- KEYS[1]  frozen: the access freeze marker, sluice:{acl}:hold (see guard.lua)
-- KEYS[2]  tenants: the tenant registry, sluice:{acl}:tenants
-- KEYS[3]  keyset: the tenant's key set, sluice:{acl}:t:<tenant>:keys
-- ARGV[1]  prefix: the access prefix, sluice:{acl}: (key records are built from it)
-- ARGV[2]  tenant: tenant id
--
-- Reply: the number of keys revoked, or -1 when the tenant was not registered.
local TENANTS, KEYSET = KEYS[2], KEYS[3]
local existed = redis_call('ZREM', TENANTS, ARGV[2])
local ids = redis_call('SMEMBERS', KEYSET)
for _, id in ipairs(ids) do redis_call('DEL', A.key(id)) end
redis_call('DEL', KEYSET)
if existed == 0 then return -1 end
return #ids
