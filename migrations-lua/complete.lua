#!lua flags=allow-oom
-- complete.lua: record the end of runs, each fenced: only the current run (its fence) of the
-- worker holding its lease changes anything. A late report of a run that was reclaimed,
-- retried or finished meanwhile is refused and counted as 'fenced'; a repeat of a report that
-- was already applied (its reply was lost) is recognised and changes nothing more.
--
-- One call carries one report or a group of them, in arrival order (group commit, see
-- src/store/commit.rs): each is recorded, and the runs it chains started, exactly as if it had
-- come alone, after those before it. Only what every report needs once is done once per call:
-- the guard, making due executions runnable, the trend counters, the next due time and the
-- eligible weight of the answer.
--
-- A cancel requested while the run went on is final: whatever the outcome, the execution ends
-- cancelled, never re-queued or retried.
--
-- The output and error message a report writes count in its tenant's logical bytes, and a
-- terminal row is retained until it expires (see "Storage" in common.lua); the tenant's
-- counters and expiry buckets are written once per call (flush_usage()).
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  runnable: the shard's runnable tenants
-- KEYS[3]  leases: its lease index
-- KEYS[4]  delayed: its timer set
-- KEYS[5]  dead_letters: its dead-letter stream
-- KEYS[6]  stats: its counters
-- KEYS[7]  dead_letter_holders: its dead-letter counts by holder (see dead_letter in common.lua)
-- KEYS[8..] reports: for each report in order, 2 keys:
--   +0 row: the execution's row
--   +1 adopted: the worker's adoption barrier (K.adopted(consumer))
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  dlq_cap: the most dead-letter records the shard keeps
-- ARGV[7]  dlq_tenant_cap: the most one tenant keeps (see dead_letter in common.lua)
-- ARGV[8]  start_log: '1' to append the starts of chains to the shard's start log, '0' not
--          (`--start-log`, see start_entries() in common.lua)
-- ARGV[9]  count: the number of reports, 1..32 (COMPLETION_GROUP in src/store/commit.rs)
-- ARGV[10..] reports: for each report in order, 12 values:
--   +0  id: execution id
--   +1  fence: the fence of the run the worker held
--   +2  consumer: the worker's consumer name
--   +3  outcome: 'completed' | 'failed' | 'cancelled'
--       | 'released'  (the worker is shutting down: back in its tenant's order at once,
--                      where it stood; the run does not count as an attempt)
--       | 'abandoned' (the worker could not renew the lease in time and stopped the run:
--                      handled like an expired lease, see recover() in common.lua)
--   +4  output: output JSON (completed), '' otherwise
--   +5  kind: error kind (failed), e.g. 'handler_error'
--   +6  message: error message (failed)
--   +7  backoff: retry backoff in ms when the failure may be retried, '' when it may not
--   +8  chain: how many runs to start for the same worker on the slot this run frees, once
--       the report is recorded (0: none). So a busy worker needs one call per execution, as
--       BullMQ's moveToFinished does, instead of a completion and a start. Like start.lua,
--       it first makes due executions runnable, and it keeps the doorbell (start_entries()).
--   +9  lease_ttl_ms: lease TTL of the runs it starts, milliseconds
--   +10 call: the call's number among the worker's start-capable calls in the shard (0:
--       none). A report its worker's last adopt.lua covered is recorded but starts nothing
--       (see start.lua).
--   +11 tenant: the tenant whose run this must be (a pull worker's, or the platform admin's
--       acting for a tenant): a run of another tenant is 'stale' to it, and not counted as
--       fenced; '' for any
--
-- Reply: one entry per report, in order, each {what, detail, started} (started as start.lua's;
-- {} when nothing was asked for, or when the report was stale or a repeat: then nothing
-- starts), then one entry more, the shard's after the whole call: {next_due, weight} (as
-- start.lua's). The shard's part comes once per call, not in every report of a group:
-- src/store/commit.rs hands it to each report. A call of one report answers
-- {{what, detail, started, next_due, weight}} instead (one table less to convert).
-- Whether a tenant can still start something
-- (start.lua's `more`) is not answered: `sluice worker` asks its next start call, not the
-- chain. Except:
-- - a report that names its tenant (ARGV[+11], a pull worker's: `POST
--   /api/worker/runs/{id}/complete`) and chains nothing gets {what, detail} alone: the pull
--   API answers its outcome and nothing of the shard, so the call reads neither the due time
--   nor the weight when no other report asks for them;
-- - a call of one report answered so, and a call of one report that changes nothing (a
--   repeat, or a run of another tenant than ARGV[+11] names), answers one string, `what` or
--   `what:detail` ('repeat', 'stale', 'done:completed'; see "Per call"), with no time, due
--   time or weight: a string costs Redis a fraction of a table, and `short_reply` in
--   src/store/commit.rs reads it back as {what[, detail]}.
-- Nothing of those is needed then: the worker learns the shard's due time and weight from
-- its next start, and sets the timer of a retry it reported itself (src/worker/launch.rs).
-- - in a call of many, a report that started nothing answers one string too: `what:detail`
--   when it asks for its outcome alone, `what:detail:` when it asks for the shard's part as
--   well (its `started` the empty text after the last ':'); `joined_report` in
--   src/store/commit.rs splits it back into {what, detail[, {}]}. Redis converts a table of a
--   reply for several thousand instructions, a string for a fraction (bench/README.md,
--   "Round eight: the completion's Lua"). No what or detail holds a ':'.
-- what, detail:
--   'stale', ''             the run is not current; nothing changed (counted in stats)
--   'repeat', ''            this run's report was applied before; nothing changed
--   'done', status          terminal now: completed, failed or cancelled
--   'dead_lettered', ''     failed with attempts exhausted (a failure that may be retried, on
--                           its last attempt): terminal failed + dead-letter record
--   ('done', 'failed' is a failure that may not be retried: terminal failed at once, no
--    dead-letter record)
--   'retrying', due_ms      failed, attempts left: scheduled again after the backoff (its
--                           slot is free meanwhile)
--   'released', ''          back in its tenant's order for another worker
--   'recovered', how        abandoned: how recover() handled it
--   'deleted', ''           the execution was force-deleted while it ran; its slot is free now
-- What record() uses, and record() itself, are made once, when the library loads
-- (src/store/compose.rs, split_once); each call sets them afresh below "Per call". The
-- dead-letter caps are read only when a report dead-letters or starts runs (most do not);
-- `fenced` counts the call's stale reports, written to the shard's counters once at its end.
local STATS, caps, now, fenced

-- The `started` of a report that starts nothing: one empty list for every such reply (a new
-- table costs about a thousand instructions; nothing writes to this one).
local NONE_STARTED = {}

-- The fields a completion drops (an earlier attempt's error), and none: made once, read only
-- (finish(), end_lease(), resize()), where a table a report would cost about a thousand
-- instructions.
local DROP_ERROR, NO_FIELDS = { 'ek', 'em' }, {}

-- What a report reads of its row: RUN_FIELDS, then `rp` (the fence of the run whose report
-- was taken), so a repeat is told by the same read.
-- (Made when the library loads, where only the language itself is at hand: no unpack().)
local function and_reported(fields)
  local all = {}
  for i = 1, #fields do all[i] = fields[i] end
  all[#fields + 1] = 'rp'
  return all
end
local REPORT_FIELDS, RP = and_reported(RUN_FIELDS), #RUN_FIELDS + 1

-- What a report with values ARGV[a..] and row fields `row` (REPORT_FIELDS) is when it
-- changes nothing, and so is counted nowhere: 'stale' for a run of another tenant than the
-- one it must be, 'repeat' for a run whose report was taken before; nil otherwise.
local function quiet(row, a)
  local want = ARGV[a + 11]
  if want ~= '' and row[5] and row[5] ~= want then return 'stale' end
  local fence = ARGV[a + 1]
  if (row[1] ~= 'running' or row[2] ~= fence or row[9] ~= ARGV[a + 2]) and row[RP] == fence then
    return 'repeat'
  end
  return nil
end

-- Records one report (its values are ARGV[a..], its row is ROW, `row` its REPORT_FIELDS when
-- read and found not quiet() already); returns what happened and its detail (see Reply).
local function record(ROW, a, row)
  local id, fence, consumer, outcome = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local output, err_kind, err_msg, backoff = ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  if not row then
    row = redis_call('HMGET', ROW, unpack(REPORT_FIELDS))
    local what = quiet(row, a)
    if what then return what, '' end
  end
  if row[1] ~= 'running' or row[2] ~= fence or row[9] ~= consumer then
    -- Counted once per call, after the reports: one HINCRBY, not one per stale report.
    fenced = fenced + 1
    return 'stale', ''
  end
  local tenant, flow, entry = row[5], row[6], row[7]

  if row[10] == '1' then
    bury(tenant, id, consumer, row[13])
    return 'deleted', ''
  end
  if outcome == 'abandoned' then
    caps = caps or dlq_caps(ARGV[6], ARGV[7])
    local how = recover(id, row, now, caps)
    redis_call('HSET', ROW, 'rp', fence)
    return 'recovered', how
  end

  -- The run is over. From here on the row stays, so the report is remembered against a
  -- repeat (`reported`, written with the outcome).

  if row[8] == '1' or outcome == 'cancelled' then
    finish(tenant, flow, id, row, 'cancelled', now, { 'rp', fence }, NO_FIELDS)
    return 'done', 'cancelled'
  elseif outcome == 'completed' then
    -- An error of an earlier attempt does not describe a success.
    finish(tenant, flow, id, row, 'completed', now, { 'o', output, 'rp', fence },
      DROP_ERROR)
    return 'done', 'completed'
  elseif outcome == 'released' then
    redis_call('HSET', ROW, 'rp', fence)
    requeue(tenant, flow, id, now, tonumber(row[3]) - 1, consumer, row[13])
    return 'released', ''
  end

  -- failed
  local exhausted = tonumber(row[3]) >= tonumber(row[4])
  if backoff ~= '' and not exhausted then
    local due = now + tonumber(backoff)
    -- Its error message stays with it while it waits: counted in its tenant's bytes.
    resize(tenant, row, { 'em', err_msg })
    end_lease(tenant, id, consumer, nil, row[13])
    index_move(tenant, flow, 'running', 'queued', id)
    schedule(tenant, flow, id, due, { 's', 'queued', 'u', now,
      'ek', err_kind, 'em', err_msg, 'rp', fence })
    notify(id, now)
    return 'retrying', due
  end
  finish(tenant, flow, id, row, 'failed', now,
    { 'ek', err_kind, 'em', err_msg, 'rp', fence }, NO_FIELDS, backoff ~= '')
  if backoff ~= '' then
    caps = caps or dlq_caps(ARGV[6], ARGV[7])
    dead_letter_run(id, tenant, flow, err_kind, row[3], entry, now, err_msg, caps)
    return 'dead_lettered', ''
  end
  return 'done', 'failed'
end

-- Per call: what record() shares, set afresh.
caps, now, fenced = nil, nil, 0
-- (Arithmetic converts the text: no tonumber() call.)
local n = ARGV[9] + 0

-- A report repeated after its answer was lost (or sent for another tenant) changes nothing:
-- alone in its call, it is answered from its row alone, before the shard's keys are checked
-- and the clock, the due time and the weight read (two thirds of such a call's cost,
-- bench/README.md "Per-call overhead, round two"). Only its row is read, and checked first;
-- the keys it does not touch are checked when a report does.
local first = nil
if n == 1 then
  first = redis_call('HMGET', declared(8, K.row(ARGV[10])), unpack(REPORT_FIELDS))
  local what = quiet(first, 10)
  if what then return what end
end

-- (The hot path: the shard's keys through the guard's memory, see declared_shard().)
declared_shard(2, K.runnable); declared_shard(3, K.leases)
declared_shard(4, K.delayed)
STATS = declared_shard(6, K.stats)
declared_shard(5, K.dlq); declared_shard(7, K.dlq_holders)
now = now_ms()

-- A report alone in its call may read its tenant's counters alone (see usage_of()).
USAGE_ALONE = n == 1
-- And a chain's start may read a tenant's limits in part (see limits()).
LIMITS_HEAD = USAGE_ALONE

-- Every report's keys are checked before anything is written.
local rows = {}
-- The consumer and adoption key of the report before: the reports of a group are mostly one
-- worker's, and its key, checked once, need not be built again for each.
local adopter, adopted = nil, nil
for r = 1, n do
  local a, k = 10 + (r - 1) * 12, 7 + (r - 1) * 2
  -- (A call of one report checked its row above.)
  rows[r] = first and KEYS[8] or declared(k + 1, K.row(ARGV[a]))
  local consumer, key = ARGV[a + 2], KEYS[k + 2]
  if consumer ~= adopter or key ~= adopted then
    declared(k + 2, K.adopted(consumer))
    adopter, adopted = consumer, key
  end
end

local replies = {}
-- A call of one report's outcome and runs, kept in locals: its answer is made at the end, one
-- table or one string (see Reply), and no table for it before.
local one_what, one_detail, one_started = nil, nil, nil
-- Whether a reply of the call tells the shard's due time and weight (see Reply).
local told = false
-- What promote_due() answered once a report chained; nil before, and once the timer set
-- changed after it (a retry scheduled, a start throttled): then next_due() reads it again.
local wait, promoted = nil, false
for r = 1, n do
  local a = 10 + (r - 1) * 12
  local consumer = ARGV[a + 2]
  local chain, ttl = ARGV[a + 8] + 0, ARGV[a + 9] + 0
  -- A report that chains has its release_slot() read the set's first member for the chain
  -- (and so do the call's later reports: TOP stays true until the set is written).
  if chain > 0 then TOP_WANTED = true end
  local what, detail = record(rows[r], a, first)
  if what == 'retrying' then wait = nil end
  local started = NONE_STARTED
  if chain > 0 and what ~= 'stale' and what ~= 'repeat' then
    if not promoted then
      wait, promoted = promote_due(now, 100), true
    end
    caps = caps or dlq_caps(ARGV[6], ARGV[7])
    -- The adoption barrier is checked by start_entries() once it finds something to start.
    local _
    _, started = start_entries(consumer, chain, ttl, caps, now, ARGV[8] == '1', nil,
      ARGV[a + 10] + 0)
    -- A start that throttled its tenant or key put a wake-up on the timer set.
    if WOKE then wait = nil end
  end
  -- A pull worker's report (it names its tenant) asks for its outcome alone (see Reply).
  local alone = chain == 0 and ARGV[a + 11] ~= ''
  if not alone then told = true end
  if n == 1 then
    one_what, one_detail, one_started = what, detail, started
  elseif started == NONE_STARTED then
    -- In a call of many, a report that started nothing is one string (see Reply).
    if alone then
      replies[r] = what .. ':' .. detail
    else
      replies[r] = what .. ':' .. detail .. ':'
    end
  else
    -- (A report that started runs chained: it is not `alone`.)
    replies[r] = { what, detail, started }
  end
end
-- (The count as text from the memo: a number would be formatted by sprintf.)
if fenced > 0 then redis_call('HINCRBY', STATS, 'fenced', num_text(fenced)) end
flush_trends()
flush_usage()
if told then
  -- The shard's part, once (see Reply). A call of one report gives it in that report's
  -- table: each table of a reply costs Redis a conversion (with its 'err'/'ok' lookups),
  -- about 1,500 instructions, more than the few values it holds.
  local due, weight = wait or next_due(now), eligible_weight()
  if n == 1 then return { { one_what, one_detail, one_started, due, weight } } end
  replies[n + 1] = { due, weight }
elseif n == 1 then
  -- One outcome alone: one string (see Reply).
  if one_detail == '' then return one_what end
  return one_what .. ':' .. one_detail
end
return replies
