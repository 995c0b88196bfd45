#!lua flags=allow-oom
-- reclaim.lua: recover executions whose lease expired (the worker died or stalled), reading
-- only expired leases from the shard's lease index: the cost follows the orphans, never the
-- number of running executions. A live lease is never touched: no attempt change. Each orphan
-- is handled by recover() (common.lua): back in its tenant's order where it stood (the next
-- start makes it attempt+1 with a new fence), dead-lettered as
-- 'lease_lost' when its attempts are used up, cancelled when its cancel was requested, or, if
-- it was force-deleted while it ran, removed with its slot.
--
-- It is also every worker's safety poll of the shard (workers are woken by the doorbell, see
-- ring() in common.lua, and this call is the one they make when nothing wakes them): scheduled
-- executions and retries whose time has come become runnable, and a shard with a runnable
-- tenant gets its doorbell set again (its marker may have been taken by a worker that died or
-- stalled before starting), so no lost wake-up strands work for longer than one scan interval.
--
-- An orphan that ends (cancelled, dead-lettered) is retained in its tenant's storage counters,
-- as complete.lua does (names built inside: the tenant's cfg and expiry buckets).
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  leases: the shard's lease index
-- KEYS[3]  runnable: its runnable tenants
-- KEYS[4]  dead_letters: its dead-letter stream
-- KEYS[5]  stats: its counters
-- KEYS[6]  delayed: its timer set
-- KEYS[7]  dead_letter_holders: its dead-letter counts by holder (see dead_letter in common.lua)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  batch: the most orphans to handle in this call
-- ARGV[7]  dlq_cap: the most dead-letter records the shard keeps
-- ARGV[8]  dlq_tenant_cap: the most one tenant keeps (see dead_letter in common.lua)
--
-- Reply: {requeued, dead_lettered, unread, next_due}
--   unread    1 when a tenant of the shard can start something now (after this call)
--   next_due  milliseconds until the shard's earliest due time, -1 for none (see start.lua)
local LEASES = declared(2, K.leases())
declared(3, K.runnable()); declared(4, K.dlq()); declared(5, K.stats()); declared(6, K.delayed())
declared(7, K.dlq_holders())
local batch, caps = tonumber(ARGV[6]), dlq_caps(ARGV[7], ARGV[8])
local now = now_ms()
local expired = redis_call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, batch)
local requeued, dead = 0, 0
for _, id in ipairs(expired) do
  local row = redis_call('HMGET', K.row(id), unpack(RUN_FIELDS))
  if row[1] ~= 'running' then
    -- Finished or deleted without its lease entry going (repair): nothing to recover.
    redis_call('ZREM', LEASES, id)
  else
    local how = recover(id, row, now, caps)
    if how == 'requeued' then requeued = requeued + 1 end
    if how == 'dead_lettered' then dead = dead + 1 end
  end
end
flush_trends()
flush_usage()
local wait = promote_due(now, batch)
local unread = 0
if redis_call('EXISTS', K.runnable()) == 1 then
  unread = 1
  ring()
end
return { requeued, dead, unread, wait }
