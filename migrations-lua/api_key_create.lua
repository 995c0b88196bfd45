#!lua
-- api_key_create.lua: store a new API key of a registered tenant, together with its place in
-- the tenant's key set (one step, so no key exists outside its tenant's set).
-- Access data lives under its own hash tag `{acl}` (see src/store/keys.rs), not in a shard.
-- Refused while Redis is over maxmemory (no allow-oom flag): it only adds data.
--
-- KEYS[1]  frozen: the access freeze marker, sluice:{acl}:hold (see guard.lua)
-- KEYS[2]  record: the key record, sluice:{acl}:key:<key id>
-- KEYS[3]  keyset: the tenant's key set, sluice:{acl}:t:<tenant>:keys
-- KEYS[4]  tenants: the tenant registry, sluice:{acl}:tenants
-- ARGV[1]  prefix: the access prefix, sluice:{acl}:
-- ARGV[2]  id: key id (16 lowercase hex)
-- ARGV[3]  tenant: tenant id (validated)
-- ARGV[4]  role: viewer | editor | admin
-- ARGV[5]  hash: SHA-256 hex of the key's secret (the secret itself is never stored)
-- ARGV[6]  name: '' for none
-- ARGV[7]  created_ms: creation time, ms since the epoch
--
-- Reply: 'ok'; 'no_tenant' when the tenant is not registered; 'exists' when the id is taken.
local RECORD, KEYSET, TENANTS = KEYS[2], KEYS[3], KEYS[4]
if redis_call('ZSCORE', TENANTS, ARGV[3]) == false then return 'no_tenant' end
if redis_call('EXISTS', RECORD) == 1 then return 'exists' end
redis_call('HSET', RECORD, 'tenant', ARGV[3], 'role', ARGV[4], 'hash', ARGV[5],
  'created', ARGV[7])
if ARGV[6] ~= '' then redis_call('HSET', RECORD, 'name', ARGV[6]) end
redis_call('SADD', KEYSET, ARGV[2])
return 'ok'
