#!lua flags=allow-oom
-- webhook.lua: a tenant's webhook, kept in its cfg (`wh_url`, `wh_secret`, `wh_at`) so that
-- the scripts that end executions learn with the tenant's limits, and no extra read, whether
-- to write its outbox (see "Webhooks" in common.lua). One operation per call:
--   set    the address (and a new secret, or the one it has): from now on every terminal
--          change of the tenant goes to its outbox
--   clear  no webhook: the outbox and what it still held are dropped (counted in the reply)
--   trim   drop outbox entries older than a stream id (the age bound), counted in the
--          tenant's `wh_dropped`
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  cfg: the tenant's limits
-- KEYS[3]  outbox: its outbox
-- KEYS[4]  webhooks: the shard's webhook tenants
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  op: 'set' | 'clear' | 'trim'
-- ARGV[8..] operands: for 'set' the address, a new secret ('' keeps the current one) and now
--          (ms); for 'trim' the oldest stream id kept; none for 'clear'
--
-- Reply: {'ok', n} (set: 1 when the secret is new; clear: entries dropped, or -1 when there
--        was no webhook; trim: entries dropped)
--      | {'no_secret'} (set without a secret on a tenant that has none: nothing written)
--      | {'moved', n} (the tenant is pinned to dedicated shard n: nothing written)
--      | {'deleting'} (set on a tenant being deleted, see tenant_drop.lua: nothing written)
local tenant, op = ARGV[6], ARGV[7]
local CFG = declared(2, K.cfg(tenant))
local BOX = declared(3, K.outbox(tenant))
local HOOKED = declared(4, K.webhooks())
local state = redis_call('HMGET', CFG, 'pinned', 'deleting')
if state[1] then return { 'moved', state[1] } end

if op == 'set' then
  if state[2] then return { 'deleting' } end
  local secret, fresh = ARGV[9], 1
  if secret == '' then
    secret, fresh = redis_call('HGET', CFG, 'wh_secret'), 0
    if not secret then return { 'no_secret' } end
  end
  -- The field 'configured' keeps the hash in existence, which marks the tenant as known.
  redis_call('HSET', CFG, 'configured', 1, 'wh_url', ARGV[8], 'wh_secret', secret)
  redis_call('HSETNX', CFG, 'wh_at', ARGV[10])
  redis_call('SADD', HOOKED, tenant)
  return { 'ok', fresh }
elseif op == 'clear' then
  local had = redis_call('HDEL', CFG, 'wh_url', 'wh_secret', 'wh_at')
  local pending = redis_call('XLEN', BOX)
  redis_call('DEL', BOX)
  redis_call('SREM', HOOKED, tenant)
  if had == 0 then return { 'ok', -1 } end
  return { 'ok', pending }
elseif op == 'trim' then
  local n = redis_call('XTRIM', BOX, 'MINID', ARGV[8])
  if n > 0 then redis_call('HINCRBY', CFG, 'wh_dropped', n) end
  return { 'ok', n }
end
return redis.error_reply('sluice: webhook.lua: unknown operation ' .. tostring(op))
