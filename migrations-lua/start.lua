#!lua flags=allow-oom
-- start.lua: pick and start up to `count` executions for one worker, in one atomic step: there
-- is no "picked but not started" state to recover from, and a worker takes only as many as it
-- has free slots. If the reply is lost (time-out), the worker finds what it started with
-- adopt.lua before it starts anything else.
--
-- First, scheduled executions and retries whose time has come become runnable (promote_due()).
-- Then start_entries() in common.lua (which complete.lua also calls, to start the next run on
-- the slot a run just freed) picks by fair share and starts; it also keeps the doorbell.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  runnable: the shard's runnable tenants
-- KEYS[3]  delayed: its timer set
-- KEYS[4]  leases: its lease index
-- KEYS[5]  dead_letters: its dead-letter stream
-- KEYS[6]  stats: its counters
-- KEYS[7]  dead_letters_indexed: its dead-letter index start (see dead_letter in common.lua)
-- KEYS[8]  adopted: the worker's adoption barrier (K.adopted(consumer))
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  consumer: the worker's consumer name
-- ARGV[7]  count: the worker's free slots (>= 1)
-- ARGV[8]  lease_ttl_ms: lease TTL, milliseconds
-- ARGV[9]  dlq_cap: the dead-letter stream's cap
-- ARGV[10] call: the call's number among the worker's start-capable calls in the shard (0:
--          none). A call its worker's last adopt.lua covered (its answer was lost, and it
--          reaches Redis only after that adopt) changes nothing and replies {0, {}}.
-- ARGV[11] start_log: '1' to append each start to the shard's start log, '0' not
--          (`--start-log`, see start_entries() in common.lua)
-- ARGV[12..] only: optional, the only tenants to start for (a pull worker serving some
--          tenants, see start_entries() in common.lua); none given: every tenant of the shard.
--
-- Reply: {more, started, next_due, weight}
--   more      1 when a tenant can still start something in the shard, else 0
--   started   a list of started executions, each one string, its fields joined by newlines:
--             id, fence, attempt, tenant, flow, version or '', max_attempts, traceparent or
--             '', tracestate or '', params (the params last: only they may hold a newline;
--             adopt.lua answers the same fields as a list, params seventh)
--   next_due  milliseconds until the shard's earliest due time (0: due now), -1 for none: the
--             worker sleeps on its own timer until then (woken earlier by the doorbell)
--   weight    the eligible weight of the shard (eligible_weight()) after the call: of the
--             tenants `only` names, when it names some
-- (The hot path: the shard's keys through the guard's memory, see declared_shard().)
declared_shard(2, K.runnable); declared_shard(3, K.delayed); declared_shard(4, K.leases)
declared_shard(5, K.dlq); declared_shard(6, K.stats); declared_shard(7, K.dlq_indexed)
-- Arithmetic converts the numbers' text (no tonumber() calls, C functions of about a thousand
-- instructions each); text that is not a number fails the call here, before any write.
local consumer, count, ttl, cap = ARGV[6], ARGV[7] + 0, ARGV[8] + 0, ARGV[9] + 0
declared(8, K.adopted(consumer))
if barred(consumer, ARGV[10] + 0) then return { 0, {}, -1, 0 } end
local now = now_ms()
-- Its starts read only the limits they need (see limits()).
LIMITS_HEAD = true
local wait = promote_due(now, 100)
local only = nil
if #ARGV > 11 then only = { unpack(ARGV, 12) } end
local more, started = start_entries(consumer, count, ttl, cap, now, ARGV[11] == '1', only)
-- A start that throttled its tenant or key put a wake-up on the timer set.
if WOKE then wait = next_due(now) end
flush_trends()
return { more, started, wait, eligible_weight(only) }
