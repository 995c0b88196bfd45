#!lua flags=allow-oom
-- tenant_reap.lua: one bounded step of removing a deleted tenant from its shard (marked by
-- tenant_drop.lua). Each call removes at most `budget` members — executions with everything
-- that names them, index entries, dead-letter records, override fields — plus a fixed number
-- of O(1) deletions, so no call walks an unbounded set; the caller repeats it until it
-- answers 'empty', then removes the tenant from the registry again (a registration that
-- raced the deletion goes too) and calls once more with `finish` to drop the mark. Nothing
-- is kept between calls but what Redis holds (every member handled leaves its structure; the
-- walk of the dead-letter records outside the tenant index keeps its place in the cfg's
-- `reap_dlq`), so any number of servers may reap the same tenant, and an interrupted reap is
-- finished by the next call.
--
-- An execution goes whatever its state, as a force delete would take it, without a webhook
-- event (the tenant's webhook went with tenant_drop.lua): queued ones off their queue or the
-- timer set, running ones fenced at once (row, lease and held-set entry gone: the holder's
-- next heartbeat answers 'lost' and its report is refused as stale, so a late completion
-- writes nothing; the holder is told now, see tell_holder()), its dedup mapping freed, its
-- waiters told it is gone. Then every other key of the tenant, by the builders of common.lua:
-- listing and flows set, its queue, slots, concurrency keys and
-- their overrides, its dead-letter index, records, count and evictions (and, while the shard's
-- older records are still being indexed, its records outside the index), its rate state, its
-- outbox and delivery log, its batch mark, its trend counters and burst mark (the forecast's),
-- its storage buckets, its dedup buckets, and its places in the shard's sets (runnable, tenants, busy, webhooks,
-- the fair share's bookkeeping, throttle wake-ups on the timer set). A delivery round that holds
-- the tenant's delivery lock is waited for (its end writes the delivery log and counts): the
-- answer is then 'held' with the lock's time left.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  cfg: the tenant's limits (holds the deletion mark)
-- KEYS[3]  reaping: the shard's tenants being deleted
-- (Every other key of the tenant and of the shard is built inside from the prefix and the
-- tenant id, by the builders: the script removes whichever of them exist, and one list of
-- the tenant's keys — common.lua's — stays the only one.)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  budget: the most members this call removes (at least 1)
-- ARGV[8]  finish: '1' to drop the mark (and the tenant from the reaping set) once nothing
--          else is left, '0' to stop short of it
--
-- Reply: {'more'}        the budget ran out: call again
--      | {'held', ms}    nothing else is left but a delivery round holds the tenant's lock for
--                        ms more: call again after it
--      | {'empty'}       nothing else is left (finish '0'): the mark stays
--      | {'done'}        nothing is left, the mark included (finish '1')
--      | {'none'}        the tenant is not being deleted (done before): nothing to do
local tenant = ARGV[6]
local CFG = declared(2, K.cfg(tenant))
local REAPING = declared(3, K.reaping())
local left = tonumber(ARGV[7])
if not left or left < 1 then
  return redis.error_reply('ERR sluice tenant_reap: budget ' .. tostring(ARGV[7]))
end
if not redis_call('HGET', CFG, 'deleting') then
  redis_call('SREM', REAPING, tenant)
  return { 'none' }
end
local now = now_ms()
-- The registries lose their members below: first the cfg stops saying that they hold them
-- (`reg_flow`, see admit.lua's header), so that an admission after the reap adds them again.
redis_call('HDEL', CFG, 'reg_flow')

-- Removes execution `id` — found in one of the tenant's structures — from everything that
-- names it, and its row, when the row is the tenant's (a member whose row expired or is
-- another's is only dropped from where it was found, which its caller did). What it is
-- removed from follows from its state, so a terminal one (most of a big tenant) costs five
-- commands; a member that drifted elsewhere is met by the drain of that structure.
local function reap(id)
  local row = redis_call('HMGET', K.row(id), 't', 's', 'f', 'kh', 'dh',
    'lo', 'w', 'q')
  if row[1] ~= tenant then return end
  local status, flow, h, digest, owner = row[2], row[3], row[4], row[5], row[6]
  announce(id, row[7], 'deleted', now)
  if status and flow then index_remove(tenant, flow, status, id) end
  if status == 'queued' and row[8] == 'scheduled' then
    redis_call('ZREM', K.delayed(), id)
    if flow then index_remove(tenant, flow, 'scheduled', id) end
  elseif status == 'queued' then
    redis_call('ZREM', K.waiting(tenant), id)
    if h then redis_call('ZREM', K.key_queue(tenant, h), id) end
  elseif status == 'running' then
    -- Fenced: no lease, no slot, no holder; the holder is told to look now.
    redis_call('SREM', K.slots(tenant), id)
    redis_call('SREM', K.deleting(tenant), id)
    redis_call('ZREM', K.leases(), id)
    if h then redis_call('SREM', K.key_running(tenant, h), id) end
    if owner and owner ~= '' then
      redis_call('SREM', K.held(owner), id)
      tell_holder(owner, id)
    end
  end
  if h then
    -- Its key's rate state and throttle wake-up (the key may have no other trace).
    redis_call('DEL', K.key_tat(tenant, h))
    redis_call('ZREM', K.delayed(), 'rk:' .. tenant .. ':' .. h)
  end
  if digest then
    digest = digest_hex(digest)
    redis_call('HDEL', K.dedup_bucket(tenant, digest), dedup_field(digest))
    redis_call('DEL', K.dedup(tenant, digest))
  end
  redis_call('DEL', K.row(id))
end

-- Takes up to `left` members of the sorted set `key`, each handed to `each` (nil: dropped);
-- true when the set is empty now.
local function drain_zset(key, each)
  if left < 1 then return redis_call('EXISTS', key) == 0 end
  local asked = left
  local popped = redis_call('ZPOPMIN', key, asked)
  for i = 1, #popped, 2 do
    if each then each(popped[i]) end
    left = left - 1
  end
  return #popped / 2 < asked
end

-- The same for the set `key`.
local function drain_set(key, each)
  if left < 1 then return redis_call('EXISTS', key) == 0 end
  local asked = left
  local popped = redis_call('SPOP', key, asked)
  for _, m in ipairs(popped) do
    if each then each(m) end
    left = left - 1
  end
  return #popped < asked
end

local MORE = { 'more' }

-- The same for the members of the listing in `status` (the running ones, or all when nil):
-- each member leaves the listing, its execution is handed to reap().
local function drain_listing(status)
  local key = K.listing(tenant)
  local min, max = '-', '+'
  if status then min, max = listing_range(status) end
  if left < 1 then return redis_call('ZLEXCOUNT', key, min, max) == 0 end
  local asked = left
  local members = redis_call('ZRANGE', key, min, max, 'BYLEX', 'LIMIT', 0, asked)
  for _, m in ipairs(members) do
    redis_call('ZREM', key, m)
    local _, _, id = listing_parse(m)
    if id then reap(id) end
    left = left - 1
  end
  return #members < asked
end

-- 1. Executions, through the listing: the running ones first (their holders are told at
-- once), then the force-deleted ones still running, then every other member.
if not drain_listing('running') then return MORE end
if not drain_set(K.deleting(tenant), reap) then return MORE end
if not drain_listing(nil) then return MORE end
if not drain_zset(K.waiting(tenant), reap) then return MORE end
if not drain_set(K.slots(tenant), reap) then return MORE end

-- 2. The flows set (its members name no other key now).
if not drain_set(K.flows(tenant), nil) then return MORE end

-- 3. Concurrency keys: the blocked ones' structures, then the overrides (and the rate state of
-- each overridden key).
local BLOCKED = K.key_blocked(tenant)
while true do
  local h = redis_call('SRANDMEMBER', BLOCKED)
  if not h then break end
  if not drain_zset(K.key_queue(tenant, h), reap) then return MORE end
  if not drain_set(K.key_running(tenant, h), reap) then return MORE end
  if left < 1 then return MORE end
  redis_call('DEL', K.key_tat(tenant, h))
  redis_call('SREM', BLOCKED, h)
  left = left - 1
end
-- (A walk that the budget cuts starts over at the next call: what it removed is gone.)
local OVERRIDES = K.key_limits(tenant)
local cursor = '0'
repeat
  if left < 1 then return MORE end
  local r = redis_call('HSCAN', OVERRIDES, cursor, 'COUNT', left)
  cursor = r[1]
  left = left - 1
  for i = 1, #r[2], 2 do
    redis_call('HDEL', OVERRIDES, r[2][i])
    redis_call('DEL', K.key_tat(tenant, r[2][i]))
    left = left - 1
  end
until cursor == '0'

-- 4. Dead letters: the records its index names (and the index, its count, its evictions),
-- then, while the shard's older records are being indexed, its records outside the index.
local INDEX, DLQ = K.tenant_dlq(tenant), K.dlq()
if left < 1 then return MORE end
local asked = left
local ids = redis_call('XRANGE', INDEX, '-', '+', 'COUNT', asked)
for _, e in ipairs(ids) do
  local rec = redis_call('XRANGE', DLQ, e[1], e[1])[1]
  if rec and record_field(rec[2], 'tenant_id') == tenant then redis_call('XDEL', DLQ, e[1]) end
  redis_call('XDEL', INDEX, e[1])
  left = left - 1
end
if #ids >= asked then return MORE end
redis_call('DEL', INDEX)
redis_call('ZREM', K.dlq_holders(), tenant)
redis_call('HDEL', K.dlq_evicted(), tenant)
local from = redis_call('HGET', CFG, 'reap_dlq') or '-'
-- Without the marker every record is indexed (dlq_reindex.lua deletes it once it has indexed
-- the older ones); with it, the shard is still being rebuilt, and any record may be outside
-- its index: the whole stream is walked, a bounded page per call.
if from ~= 'done' and redis_call('EXISTS', K.dlq_indexed()) == 0 then from = 'done' end
if from ~= 'done' then
  if left < 1 then return MORE end
  asked = left
  local page = redis_call('XRANGE', DLQ, from, '+', 'COUNT', asked)
  for _, rec in ipairs(page) do
    if record_field(rec[2], 'tenant_id') == tenant then redis_call('XDEL', DLQ, rec[1]) end
    left = left - 1
  end
  if #page >= asked then
    redis_call('HSET', CFG, 'reap_dlq', '(' .. page[#page][1])
    return MORE
  end
  redis_call('HSET', CFG, 'reap_dlq', 'done')
end

-- 5. The rest, each O(1) (or bounded by its own cap: the outbox by its 10,000 entries, the
-- delivery log by about 200).
local day = math.floor(now / 86400000)
redis_call('DEL', K.outbox(tenant), K.delivery_log(tenant), K.batch_lock(tenant), K.tat(tenant),
  K.trends(tenant, day), K.trends(tenant, day - 1), K.trends(tenant, day - 2), K.burst(tenant),
  K.retained(tenant))
-- Its dedup buckets: emptied by the executions above, unless a field outlived its row.
local buckets = {}
for b = 0, 255 do buckets[b + 1] = K.dedup_bucket(tenant, string.format('%02x', b)) end
redis_call('DEL', unpack(buckets))
redis_call('ZREM', K.delayed(), 'rt:' .. tenant)
local vt = redis_call('ZSCORE', K.runnable(), tenant)
if vt then leave(tenant, tonumber(vt), select(5, limits(tenant))) end
redis_call('HDEL', K.sched(), 'vt:' .. tenant)
redis_call('SREM', K.busy(), tenant)
redis_call('SREM', K.tenants(), tenant)
redis_call('SREM', K.webhooks(), tenant)

-- A delivery round in flight writes its log and counts when it ends: wait for it.
local lock = redis_call('PTTL', K.delivery_lock(tenant))
if lock > 0 then return { 'held', lock } end
-- A lock sluice did not set (no time-out) would hold the reap forever.
if lock == -1 then redis_call('DEL', K.delivery_lock(tenant)) end

if ARGV[8] ~= '1' then return { 'empty' } end
redis_call('DEL', CFG)
redis_call('SREM', REAPING, tenant)
return { 'done' }
