-- api_key_auth.lua: look up an API key for authentication. A key counts only while its record
-- exists, its tenant is registered and the key is in the tenant's key set, so a key orphaned
-- in any way (revoked, tenant deleted) never authenticates. The caller compares the secret's
-- hash in constant time.
--
-- KEYS[1]  the key record, sluice:{acl}:key:<key id>
-- KEYS[2]  the tenant registry, sluice:{acl}:tenants
-- ARGV[1]  the access prefix, sluice:{acl}: (the tenant's key set is built from it)
-- ARGV[2]  key id
--
-- Reply: {tenant, role, secret hash} for a live key, {} otherwise.
local rec = redis.call('HMGET', KEYS[1], 'tenant', 'role', 'hash')
if not rec[1] or not rec[2] or not rec[3] then return {} end
if redis.call('ZSCORE', KEYS[2], rec[1]) == false then return {} end
if redis.call('SISMEMBER', ARGV[1] .. 't:' .. rec[1] .. ':keys', ARGV[2]) == 0 then return {} end
return rec
