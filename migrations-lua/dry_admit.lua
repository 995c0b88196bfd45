#!lua flags=no-writes
-- dry_admit.lua: what admit.lua would do with this request now, writing nothing (the
-- `no-writes` flag makes Redis refuse any write): the dedup check, the quota decision, the
-- storage decision (on the counters as a drain would leave them: see "Storage" in
-- common.lua), and where the execution would stand. With one admission (count 1; its id,
-- the 10th value, is unused). A snapshot: the real admission decides again, atomically, when
-- it is made.
--
-- KEYS and ARGV: as admit.lua
--
-- Reply, one of:
--   {'duplicate', id, row}  the dedup key maps to live execution id, same request (its view)
--   {'conflict', id}        the dedup key maps to id, another request
--   {'disabled'} | {'deleting'} | {'full', queued} | {'moved', n}   as admit.lua
--   {'too_large', ...} | {'storage_full', ...}                    as admit.lua
--   {'schedule', due}       it would be scheduled for `due` (ms)
--   {'admit' | 'wait', reason, tpos, kpos, klimit}
--                           it would be runnable: 'admit' when it would be `ready` (reason
--                           'ready'), 'wait' behind its tenant's max_concurrent (reason
--                           'tenant_at_max_concurrent'), its key's limit ('key_at_limit'),
--                           its tenant's rate ('tenant_throttled') or its key's rate
--                           ('key_throttled');
--                           its position as position() in common.lua gives it ('' where none)
local tenant, flow, params = ARGV[9], ARGV[11], ARGV[13]
local dedup, fingerprint = ARGV[15], ARGV[17]
local priority, start_at = ARGV[18], ARGV[19]
local run_at, delay = nil, nil
if start_at ~= '' then
  local ms = tonumber(string.sub(start_at, 2))
  if string.sub(start_at, 1, 1) == '@' then run_at = ms else delay = ms end
end
local ckh = ARGV[21] or ''

if dedup ~= '' then
  local holder, holder_fp = dedup_holder(KEYS[3], KEYS[4], ARGV[24], fingerprint)
  if holder then
    if holder_fp ~= fingerprint then return { 'conflict', holder } end
    return { 'duplicate', holder, view(holder) }
  end
end

local now = now_ms()
local ok, refusal, queued = place(tenant)
if not ok then return { refusal, queued } end
local full = storage_refusal(tenant, ROW_BYTES + #params, 0, now, ARGV[7], ARGV[8], true)
if full then return full end
local due = run_at or (delay and now + delay)
if due and due > now then return { 'schedule', due } end

-- It would join its tenant's order (or its key's queue) at this order key, after every
-- entry with the same one (admitted before it).
local at = order_key(now, priority)
local ahead = redis_call('ZCOUNT', K.waiting(tenant), '-inf', at)
local max_concurrent, _, _, _, _, _, rate, key_rate = limits(tenant)
local free = max_concurrent - redis_call('SCARD', K.slots(tenant))
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
local key_ahead = redis_call('ZCOUNT', K.key_queue(tenant, ckh), '-inf', at)
local limit = key_limit(tenant, ckh)
local key_room = not limit
  or redis_call('SCARD', K.key_running(tenant, ckh)) + key_ahead < limit
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
