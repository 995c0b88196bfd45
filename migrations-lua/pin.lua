#!lua flags=allow-oom
-- pin.lua: mark a tenant of this (hashed) shard as pinned to a dedicated shard, so that every
-- admission or limit change for it that still arrives here (from a process that has not yet
-- learned the pin) is sent on instead of writing here. Only a tenant with nothing in this
-- shard can be pinned: its executions cannot follow it to another slot atomically.
-- Unpinning runs the same script on the tenant's dedicated shard, naming its hashed shard as
-- the target: the move back has the same rule and leaves the same marker.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  cfg: the tenant's limits
-- KEYS[3]  slots: its slot set
-- KEYS[4]  waiting: its waiting set
-- KEYS[5]  deleting: its force-deleted, still running set
-- KEYS[6]  listing: its listing (K.listing() in common.lua)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  to: the dedicated shard's number
--
-- Reply, one of:
--   {'pinned', n, max_concurrent, max_queued, enabled, weight, max_concurrent_per_key, rate,
--    key_rate, wh_url, wh_secret, wh_at, max_bytes, max_retained, overrides...}
--                        pinned to shard n (now, or
--                        before); the tenant's own limits and webhook ('' where it has none)
--                        and its concurrency keys' overrides (field, value pairs of
--                        K.key_limits), to copy there. Overrides and webhook leave this shard.
--   {'busy', held}       the tenant has executions (or webhook events not delivered yet)
--                        here, or is being deleted (tenant_drop.lua: its mark and what is
--                        left of it stay where they are until tenant_reap.lua is done);
--                        nothing written
local tenant, target = ARGV[6], ARGV[7]
local CFG = declared(2, K.cfg(tenant))
local SLOTS, WAITING = declared(3, K.slots(tenant)), declared(4, K.waiting(tenant))
local DELETING = declared(5, K.deleting(tenant))
local held = redis_call('SCARD', SLOTS) + redis_call('ZCARD', WAITING)
  + redis_call('SCARD', DELETING)
  + redis_call('ZCARD', declared(6, K.listing(tenant)))
-- Webhook events not delivered yet cannot follow either.
held = held + redis_call('XLEN', K.outbox(tenant))
local v = redis_call('HMGET', CFG, 'pinned', 'max_concurrent', 'max_queued', 'enabled',
  'weight', 'max_concurrent_per_key', 'rate', 'key_rate', 'wh_url', 'wh_secret', 'wh_at',
  'max_bytes', 'max_retained', 'deleting')
if v[14] then held = held + 1 end
local function reply(n)
  local out = { 'pinned', n, v[2] or '', v[3] or '', v[4] or '', v[5] or '', v[6] or '',
    v[7] or '', v[8] or '', v[9] or '', v[10] or '', v[11] or '', v[12] or '', v[13] or '' }
  for _, x in ipairs(redis_call('HGETALL', K.key_limits(tenant))) do table.insert(out, x) end
  return out
end
if v[1] then return reply(v[1]) end
if held > 0 then return { 'busy', held } end
redis_call('HSET', CFG, 'pinned', target)
local out = reply(target)
redis_call('DEL', K.key_limits(tenant))
-- Its webhook moves with it (pin_home.lua sets it there): no event is written here now.
redis_call('HDEL', CFG, 'wh_url', 'wh_secret', 'wh_at')
redis_call('SREM', K.webhooks(), tenant)
return out
