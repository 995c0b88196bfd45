-- api_key_create.lua: store a new API key of a registered tenant, together with its place in
-- the tenant's key set (one step, so no key exists outside its tenant's set).
-- Access data lives under its own hash tag `{acl}` (see src/store/keys.rs), not in a shard.
--
-- KEYS[1]  the key record, sluice:{acl}:key:<key id>
-- KEYS[2]  the tenant's key set, sluice:{acl}:t:<tenant>:keys
-- KEYS[3]  the tenant registry, sluice:{acl}:tenants
-- ARGV[1]  key id (16 lowercase hex)
-- ARGV[2]  tenant id (validated)
-- ARGV[3]  role: viewer | editor | admin
-- ARGV[4]  SHA-256 hex of the key's secret (the secret itself is never stored)
-- ARGV[5]  name, '' for none
-- ARGV[6]  creation time, ms since the epoch
--
-- Reply: 'ok'; 'no_tenant' when the tenant is not registered; 'exists' when the id is taken.
if redis.call('ZSCORE', KEYS[3], ARGV[2]) == false then return 'no_tenant' end
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
redis.call('HSET', KEYS[1], 'tenant', ARGV[2], 'role', ARGV[3], 'hash', ARGV[4],
  'created', ARGV[6])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'name', ARGV[5]) end
redis.call('SADD', KEYS[2], ARGV[1])
return 'ok'
