-- api_key_revoke.lua: delete one API key of a tenant. The next request with it is a 401.
--
-- KEYS[1]  the key record, sluice:{acl}:key:<key id>
-- KEYS[2]  the tenant's key set, sluice:{acl}:t:<tenant>:keys
-- ARGV[1]  key id
-- ARGV[2]  tenant id
--
-- Reply: 1 revoked; 0 no such key for this tenant (another tenant's key is left alone).
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
