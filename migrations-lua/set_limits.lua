-- set_limits.lua: replace a tenant's own limits, then dispatch waiting executions into any
-- room a raised max_concurrent made (in the same step, so none waits for the next release).
--
-- KEYS[1]  the tenant's config key (routing only)
-- ARGV[1..4] common (see common.lua)
-- ARGV[5]  tenant id
-- ARGV[6]  max_concurrent, '' for the server default
-- ARGV[7]  max_queued, '' for the server default
-- ARGV[8]  enabled '1' / '0', '' for the default (enabled)
--
-- Reply: 'ok'
local tenant = ARGV[5]
local values = { max_concurrent = ARGV[6], max_queued = ARGV[7], enabled = ARGV[8] }
-- The field 'configured' keeps the hash in existence, which marks the tenant as known.
redis.call('HSET', K.cfg(tenant), 'configured', 1)
for field, value in pairs(values) do
  if value == '' then
    redis.call('HDEL', K.cfg(tenant), field)
  else
    redis.call('HSET', K.cfg(tenant), field, value)
  end
end
promote(tenant, now_ms())
return 'ok'
