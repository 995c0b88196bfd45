#!lua flags=allow-oom
-- api_key_revoke.lua: delete one API key of a tenant. The next request with it is a 401.
--
-- KEYS[1]  frozen: the access freeze marker, sluice:{acl}:hold (see guard.lua)
-- KEYS[2]  record: the key record, sluice:{acl}:key:<key id>
-- KEYS[3]  keyset: the tenant's key set, sluice:{acl}:t:<tenant>:keys
-- ARGV[1]  prefix: the access prefix, sluice:{acl}:
-- ARGV[2]  id: key id
-- ARGV[3]  tenant: tenant id
--
-- Reply: 1 revoked; 0 no such key for this tenant (another tenant's key is left alone).
local RECORD, KEYSET = KEYS[2], KEYS[3]
if redis_call('HGET', RECORD, 'tenant') ~= ARGV[3] then return 0 end
redis_call('DEL', RECORD)
redis_call('SREM', KEYSET, ARGV[2])
return 1
