#!lua
-- admit.lua: admit one execution, atomically: dedup claim, row, indexes, quota decision, enqueue.
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the new execution's row          KEYS[3]  its void marker (abandon.lua)
-- KEYS[4]  the tenant's limits (cfg)        KEYS[5]  its slot set
-- KEYS[6]  its waiting set                  KEYS[7]  its 'queued' status index
-- KEYS[8]  its 'queued' index of the flow   KEYS[9]  its set of flows
-- KEYS[10] the shard's tenant set           KEYS[11] the shard's runnable tenants
-- KEYS[12] the shard's timer set            KEYS[13] the dedup mapping (only with a dedup key)
-- (Also written, names built inside from the prefix since Redis's clock picks the day: the
-- trends counters and the shard's busy set, see the trends block of common.lua; and with a
-- concurrency key, the key's queue and the tenant's blocked keys, see "Concurrency keys".)
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  tenant id (validated: no braces, colons or spaces)
-- ARGV[7]  new execution id (32 lowercase hex, minted by the caller)
-- ARGV[8]  flow id (validated key-safe)
-- ARGV[9]  version, '' for none
-- ARGV[10]  params, JSON text of an object
-- ARGV[11] max_attempts
-- ARGV[12] dedup key as given, '' for none
-- ARGV[13] digest of the dedup key: 128 bits of its SHA-256, hex ('' for none)
-- ARGV[14] request fingerprint (flow, version, params), hex
-- ARGV[15] priority, 1..5 (1 first)
-- ARGV[16] run_at: when to start at the earliest, Unix ms ('' for now)
-- ARGV[17] delay: how long after the admission to start at the earliest, ms ('' for none)
-- ARGV[18] concurrency key as given, '' for none
-- ARGV[19] digest of the concurrency key (as the dedup key's), '' for none
-- ARGV[20] W3C traceparent, '' for none (validated by the caller)
-- ARGV[21] W3C tracestate, '' for none
--
-- Reply, one of:
--   {'new', qstate, now, due, tpos, kpos, klimit}
--                       admitted at `now` (ms), queue state 'scheduled', 'ready' or
--                       'waiting' (see queue_state() in common.lua), due time in ms or ''
--                       when not scheduled; when runnable, its position (position() in
--                       common.lua; '' where none); the caller knows the rest of the row
--   {'dup', id, row}    the dedup key maps to live execution id, admitted with the same request
--   {'conflict', id}    the dedup key maps to id, admitted with a different request
--   {'void'}            this id was declared abandoned (abandon.lua ran first); nothing written
--   {'disabled'}        the tenant is disabled; nothing written
--   {'full', queued}    the tenant has max_queued executions queued; nothing written
--   {'moved', n}        the tenant is pinned to dedicated shard n (pin.lua; the quota decision
--                       of place() finds it): nothing written
local tenant, id, flow = ARGV[6], ARGV[7], ARGV[8]
-- The hot path: unlike the other scripts, admit does not rebuild each declared key to check
-- its position (that cost ~7 % of an admission). guard.lua has checked that every key is in
-- this shard; the one caller (`Store::admit`) lists them in this order, and the test
-- `fences::admit_declares_the_keys_it_writes` checks that list against what the script writes.
-- KEYS[2], the row, is written by enqueue() (K.row(id) is that name).
local VOID = KEYS[3]
local QUEUED_IDX, FLOW_QUEUED_IDX = KEYS[7], KEYS[8]
local FLOWS, TENANTS = KEYS[9], KEYS[10]

local version, params = ARGV[9], ARGV[10]
local max_attempts, dedup, dedup_hash, fingerprint = ARGV[11], ARGV[12], ARGV[13], ARGV[14]
local priority, run_at, delay = ARGV[15], tonumber(ARGV[16]), tonumber(ARGV[17])
local ckey, ckh = ARGV[18], ARGV[19]
local traceparent, tracestate = ARGV[20], ARGV[21]

-- The caller gave up on this admission and was told nothing happened: keep it that way.
if redis.call('EXISTS', VOID) == 1 then return { 'void' } end

local dedup_key = nil
if dedup ~= '' then
  dedup_key = KEYS[13]
  local holder, holder_fp = dedup_holder(dedup_key)
  if holder then
    if holder_fp ~= fingerprint then return { 'conflict', holder } end
    return { 'dup', holder, view(holder) }
  end
end

local now = now_ms()
local ok, refusal, queued = place(tenant)
if not ok then return { refusal, queued } end
local due = run_at or (delay and now + delay)
if due and due <= now then due = nil end

-- Decided; from here on only writes.
local row = { 'tenant', tenant, 'flow', flow, 'params', params, 'status', 'queued',
  'attempt', 0, 'max_attempts', max_attempts, 'created', now, 'updated', now,
  'priority', priority }
if version ~= '' then table.insert(row, 'version'); table.insert(row, version) end
if dedup ~= '' then
  for _, v in ipairs({ 'dedup', dedup, 'ddh', dedup_hash }) do table.insert(row, v) end
end
if ckh ~= '' then
  for _, v in ipairs({ 'ckey', ckey, 'ckh', ckh }) do table.insert(row, v) end
else
  ckh = nil
end
if traceparent ~= '' then
  for _, v in ipairs({ 'tp', traceparent }) do table.insert(row, v) end
  if tracestate ~= '' then for _, v in ipairs({ 'tst', tracestate }) do table.insert(row, v) end end
end
redis.call('ZADD', QUEUED_IDX, 0, id)
redis.call('ZADD', FLOW_QUEUED_IDX, 0, id)
-- Registries the sweeper walks (set members: repeated admissions cost nothing more).
redis.call('SADD', TENANTS, tenant)
redis.call('SADD', FLOWS, flow)
-- The row is written here, with its queue state, in one HSET.
if not enqueue(tenant, flow, id, now, priority, due, row, ckh) then mark_busy(tenant) end
tally(tenant, 'admitted', now)
flush_trends()
-- No TTL while the execution is not terminal: settle_terminal() sets it when it ends.
if dedup_key then redis.call('SET', dedup_key, id .. ':' .. fingerprint) end
if due then return { 'new', 'scheduled', now, due } end
local tpos, kpos, klimit, rank = position(tenant, id, ckh)
return { 'new', queue_state(tenant, id, 'queued', rank), now, '', tpos or '', kpos or '',
  klimit or '' }
