-- acl_keys.lua: key builders of the access scripts (composed after guard.lua, which checked
-- ARGV[1], the access prefix "sluice:{acl}:"). Not an operation on its own. The names mirror
-- `keys::api_key`, `keys::tenant_keys` and `keys::tenants` in src/store/keys.rs (a test runs
-- these builders against the Rust ones).
local A = {}
function A.key(id) return P .. 'key:' .. id end
function A.tenant_keys(t) return P .. 't:' .. t .. ':keys' end
function A.tenants() return P .. 'tenants' end
function A.frozen() return P .. 'hold' end
