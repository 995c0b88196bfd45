#!lua flags=allow-oom
-- start.lua: read up to `count` new entries of the shard's ready stream for one worker and start
-- each of them, in the same atomic step. So an entry is in the pending list only while a worker
-- is running it (there is no "read but not started" state to recover from), and a worker reads
-- only as many entries as it has free slots. If the reply is lost (time-out), the worker finds
-- what it started with adopt.lua before it starts anything else.
--
-- First, retries whose backoff is over are put back on the ready stream (they kept their slot).
-- Then start_entries() in common.lua (which complete.lua also calls, to start the next run on
-- the slot a run just freed) reads and starts; it also keeps the shard's doorbell.
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the shard's ready stream    KEYS[3]  its retry delays  KEYS[4]  its lease index
-- KEYS[5]  its dead-letter stream      KEYS[6]  its counters
-- KEYS[7]  its dead-letter index start (see dead_letter in common.lua)
-- KEYS[8]  the worker's adoption barrier (K.adopted(consumer))
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  consumer name (the worker)
-- ARGV[7]  count: the worker's free slots (>= 1)
-- ARGV[8]  lease TTL, milliseconds
-- ARGV[9]  dead-letter stream cap
-- ARGV[10] the call's number among the worker's start-capable calls in the shard (0: none). A
--          call its worker's last adopt.lua covered (its answer was lost, and it reaches Redis
--          only after that adopt) changes nothing and replies {0, {}}.
--
-- Reply: {more, started}
--   more      1 when the call read as many entries as it asked for (more may be waiting), else 0
--   started   a list of started executions, each
--             {id, fence, attempt, tenant, flow, version or '', params, max_attempts}
declared(2, K.ready()); declared(3, K.delayed()); declared(4, K.leases())
declared(5, K.dlq()); declared(6, K.stats()); declared(7, K.dlq_indexed())
local consumer, count, ttl, cap = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
declared(8, K.adopted(consumer))
if barred(consumer, tonumber(ARGV[10])) then return { 0, {} } end
local now = now_ms()
promote_due(now, 100)
local more, started = start_entries(consumer, count, ttl, cap, now)
return { more, started }
