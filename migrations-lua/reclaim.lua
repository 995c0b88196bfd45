#!lua flags=allow-oom
-- reclaim.lua: recover executions whose lease expired (the worker died or stalled), reading
-- only expired leases from the shard's lease index: the cost follows the orphans, never the
-- number of running executions. A live lease is never touched: no XCLAIM, no delivery count
-- or attempt change. Each orphan is handled by recover() (common.lua): back on the ready stream
-- (a new entry; the next start makes it attempt+1 with a new fence), dead-lettered as
-- 'lease_lost' when its attempts are used up, cancelled when its cancel was requested, or, if
-- it was force-deleted while it ran, removed with its slot.
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the shard's lease index     KEYS[3]  its ready stream
-- KEYS[4]  its dead-letter stream      KEYS[5]  its counters
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  most orphans to handle in this call
-- ARGV[7]  dead-letter stream cap
--
-- Reply: {requeued, dead_lettered}
local LEASES = declared(2, K.leases())
declared(3, K.ready()); declared(4, K.dlq()); declared(5, K.stats())
local batch, cap = tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, batch)
local requeued, dead = 0, 0
for _, id in ipairs(expired) do
  local row = redis.call('HMGET', K.row(id), unpack(RUN_FIELDS))
  if row[1] ~= 'running' then
    -- Finished or deleted without its lease entry going (repair): nothing to recover.
    redis.call('ZREM', LEASES, id)
  else
    local how = recover(id, row, now, cap)
    if how == 'requeued' then requeued = requeued + 1 end
    if how == 'dead_lettered' then dead = dead + 1 end
  end
end
return { requeued, dead }
