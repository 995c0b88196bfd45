#!lua flags=no-writes
-- dry_admit.lua: what admit.lua would do with this request now, writing nothing (the
-- `no-writes` flag makes Redis refuse any write): the dedup check, the quota decision, and
-- where the execution would stand. With one admission (ARGV[6] is 1; ARGV[8], the id, is
-- unused). A snapshot: the real admission decides again, atomically, when it is made.
--
-- KEYS and ARGV: as admit.lua
--
-- Reply, one of:
--   {'duplicate', id, row}  the dedup key maps to live execution id, same request (its view)
--   {'conflict', id}        the dedup key maps to id, another request
--   {'disabled'} | {'deleting'} | {'full', queued} | {'moved', n}   as admit.lua
--   {'schedule', due}       it would be scheduled for `due` (ms)
--   {'admit' | 'wait', reason, tpos, kpos, klimit}
--                           it would be runnable: 'admit' when it would be `ready` (reason
--                           'ready'), 'wait' behind its tenant's max_concurrent (reason
--                           'tenant_at_max_concurrent'), its key's limit ('key_at_limit'),
--                           its tenant's rate ('tenant_throttled') or its key's rate
--                           ('key_throttled');
--                           its position as position() in common.lua gives it ('' where none)
local tenant, flow = ARGV[7], ARGV[9]
local dedup, fingerprint = ARGV[13], ARGV[15]
local priority, run_at, delay = ARGV[16], tonumber(ARGV[17]), tonumber(ARGV[18])
local ckh = ARGV[20] or ''

if dedup ~= '' then
  local holder, holder_fp = dedup_holder(KEYS[13])
  if holder then
    if holder_fp ~= fingerprint then return { 'conflict', holder } end
    return { 'duplicate', holder, view(holder) }
  end
end

local now = now_ms()
local ok, refusal, queued = place(tenant)
if not ok then return { refusal, queued } end
local due = run_at or (delay and now + delay)
if due and due > now then return { 'schedule', due } end

-- It would join its tenant's order (or its key's queue) at this order key, after every
-- entry with the same one (admitted before it).
local at = order_key(now, priority)
local ahead = redis.call('ZCOUNT', K.waiting(tenant), '-inf', at)
local max_concurrent, _, _, _, _, _, rate, key_rate = limits(tenant)
local free = max_concurrent - redis.call('SCARD', K.slots(tenant))
-- Held back by a rate (read only: the real start takes the token).
local function throttled(text, cell)
  local _, tau = rate_of(text)
  return tau ~= nil and conforms_at(cell, tau) > now
end
local tenant_held = throttled(rate, K.tat(tenant))
if ckh == '' then
  if ahead < free and tenant_held then return { 'wait', 'tenant_throttled', ahead, '', '' } end
  if ahead < free then return { 'admit', 'ready', ahead, '', '' } end
  return { 'wait', 'tenant_at_max_concurrent', ahead, '', '' }
end
local key_ahead = redis.call('ZCOUNT', K.key_queue(tenant, ckh), '-inf', at)
local limit = key_limit(tenant, ckh)
local key_room = not limit
  or redis.call('SCARD', K.key_running(tenant, ckh)) + key_ahead < limit
if not key_room then
  return { 'wait', 'key_at_limit', ahead, key_ahead, limit }
end
if throttled(key_rate, K.key_tat(tenant, ckh)) then
  return { 'wait', 'key_throttled', ahead, key_ahead, limit or -1 }
end
if ahead < free and tenant_held then
  return { 'wait', 'tenant_throttled', ahead, key_ahead, limit or -1 }
end
if ahead < free then return { 'admit', 'ready', ahead, key_ahead, limit or -1 } end
return { 'wait', 'tenant_at_max_concurrent', ahead, key_ahead, limit or -1 }
