#!lua flags=no-writes
-- api_key_auth.lua: look up an API key for authentication. A key counts only while its record
-- exists, its tenant is registered and the key is in the tenant's key set, so a key orphaned
-- in any way (revoked, tenant deleted) never authenticates. The caller compares the secret's
-- hash in constant time. Read-only (`no-writes`: it also runs while Redis is over maxmemory).
--
-- KEYS[1]  frozen: the access freeze marker, sluice:{acl}:hold (see guard.lua)
-- KEYS[2]  record: the key record, sluice:{acl}:key:<key id>
-- KEYS[3]  tenants: the tenant registry, sluice:{acl}:tenants
-- ARGV[1]  prefix: the access prefix, sluice:{acl}: (the tenant's key set is built from it)
-- ARGV[2]  id: key id
--
-- Reply: {tenant, role, secret hash} for a live key, {} otherwise.
local RECORD, TENANTS = KEYS[2], KEYS[3]
local rec = redis_call('HMGET', RECORD, 'tenant', 'role', 'hash')
if not rec[1] or not rec[2] or not rec[3] then return {} end
if redis_call('ZSCORE', TENANTS, rec[1]) == false then return {} end
if redis_call('SISMEMBER', A.tenant_keys(rec[1]), ARGV[2]) == 0 then return {} end
return rec
