#!lua flags=allow-oom
-- pin_home.lua: make this shard a tenant's home, as the last step of pinning it to a
-- dedicated shard (run there) or of unpinning it (run on its hashed shard): drop the `pinned`
-- marker an earlier move left here (pin.lua writes it in the shard a tenant leaves, so that
-- servers that have not learned the move yet are sent on) and give the tenant exactly the
-- limits it had where it comes from. Safe to repeat.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  cfg: the tenant's limits
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  max_concurrent: '' = none of its own: the server default
-- ARGV[8]  max_queued: likewise
-- ARGV[9]  enabled: '0' disabled; '' the default, enabled
-- ARGV[10] weight: '' = the default, 1
-- ARGV[11] max_concurrent_per_key: '' = none
-- ARGV[12] rate: '' = none
-- ARGV[13] key_rate: '' = none
-- ARGV[14] webhook: its webhook's address ('' = no webhook)
-- ARGV[15] secret: its webhook's secret
-- ARGV[16] webhook_set: when its webhook was set
-- ARGV[17] max_bytes: '' = none of its own: the server default (see "Storage" in common.lua)
-- ARGV[18] max_retained: likewise
-- ARGV[19..] overrides: the concurrency keys' overrides, field and value pairs of
--          K.key_limits (they replace any here)
--
-- Reply: 1
local tenant = ARGV[6]
local CFG = declared(2, K.cfg(tenant))
redis_call('HDEL', CFG, 'pinned')
-- The field 'configured' keeps the hash in existence, which marks the tenant as known.
redis_call('HSET', CFG, 'configured', 1)
local values = { max_concurrent = ARGV[7], max_queued = ARGV[8], enabled = ARGV[9],
  weight = ARGV[10], max_concurrent_per_key = ARGV[11] or '', rate = ARGV[12] or '',
  key_rate = ARGV[13] or '', wh_url = ARGV[14] or '', wh_secret = ARGV[15] or '',
  wh_at = ARGV[16] or '', max_bytes = ARGV[17] or '', max_retained = ARGV[18] or '' }
for field, value in pairs(values) do
  if value == '' then redis_call('HDEL', CFG, field) else redis_call('HSET', CFG, field, value) end
end
if values.wh_url ~= '' then
  redis_call('SADD', K.webhooks(), tenant)
else
  redis_call('SREM', K.webhooks(), tenant)
end
redis_call('DEL', K.key_limits(tenant))
for i = 19, #ARGV, 2 do redis_call('HSET', K.key_limits(tenant), ARGV[i], ARGV[i + 1]) end
return 1
