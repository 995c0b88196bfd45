#!lua flags=allow-oom
-- complete.lua: record the end of one run, fenced: only the current run (its fence) of the
-- worker holding its lease changes anything. A late report of a run that was reclaimed,
-- retried or finished meanwhile is refused and counted as 'fenced'; a repeat of a report that
-- was already applied (its reply was lost) is recognised and changes nothing more.
--
-- A cancel requested while the run went on is final: whatever the outcome, the execution ends
-- cancelled, never re-queued or retried.
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the execution's row
-- KEYS[3]  the shard's runnable tenants KEYS[4]  its lease index  KEYS[5]  its timer set
-- KEYS[6]  its dead-letter stream      KEYS[7]  its counters
-- KEYS[8]  its dead-letter index start (see dead_letter in common.lua)
-- KEYS[9]  the worker's adoption barrier (K.adopted(consumer))
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  execution id
-- ARGV[7]  fence of the run the worker held
-- ARGV[8]  consumer name (the worker)
-- ARGV[9]  outcome: 'completed' | 'failed' | 'cancelled'
--          | 'released'  (the worker is shutting down: back in its tenant's order at once,
--                         where it stood; the run does not count as an attempt)
--          | 'abandoned' (the worker could not renew the lease in time and stopped the run:
--                         handled like an expired lease, see recover() in common.lua)
-- ARGV[10] output JSON (completed), '' otherwise
-- ARGV[11] error kind (failed), e.g. 'handler_error'
-- ARGV[12] error message (failed)
-- ARGV[13] retry backoff in ms when the failure may be retried, '' when it may not
-- ARGV[14] dead-letter stream cap
-- ARGV[15] chain: how many runs to start for the same worker on the slot this run frees, once
--          the report is recorded (0: none). So a busy worker needs one call per execution, as
--          BullMQ's moveToFinished does, instead of a completion and a start. Like start.lua,
--          it first makes due executions runnable, and it keeps the doorbell (start_entries()).
-- ARGV[16] lease TTL of the runs it starts, milliseconds
-- ARGV[17] the call's number among the worker's start-capable calls in the shard (0: none). A
--          call its worker's last adopt.lua covered records the report but starts nothing
--          (see start.lua).
--
-- Reply: {what, detail, more, started, next_due, weight}; the last four as start.lua's (0 and
-- {} when nothing was asked for, or when the report was stale or a repeat: then nothing
-- starts).
-- what, detail:
--   'stale', ''             the run is not current; nothing changed (counted in stats)
--   'repeat', ''            this run's report was applied before; nothing changed
--   'done', status          terminal now: completed, failed or cancelled
--   'dead_lettered', ''     failed with attempts exhausted: terminal failed + dead-letter record
--   'retrying', due_ms      failed, attempts left: scheduled again after the backoff (its
--                           slot is free meanwhile)
--   'released', ''          back in its tenant's order for another worker
--   'recovered', how        abandoned: how recover() handled it
--   'deleted', ''           the execution was force-deleted while it ran; its slot is free now
local id = ARGV[6]
local ROW = declared(2, K.row(id))
declared(3, K.runnable()); declared(4, K.leases())
declared(5, K.delayed())
local STATS = declared(7, K.stats())
declared(6, K.dlq()); declared(8, K.dlq_indexed())
local fence, consumer, outcome = ARGV[7], ARGV[8], ARGV[9]
local output, err_kind, err_msg, backoff = ARGV[10], ARGV[11], ARGV[12], ARGV[13]
local cap, chain, ttl = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
declared(9, K.adopted(consumer))
local now = now_ms()

-- Records the report; returns what happened and its detail (see Reply).
local function record()
  local row = redis.call('HMGET', ROW, unpack(RUN_FIELDS))
  if row[1] ~= 'running' or row[2] ~= fence or row[9] ~= consumer then
    if redis.call('HGET', ROW, 'reported') == fence then return 'repeat', '' end
    redis.call('HINCRBY', STATS, 'fenced', 1)
    return 'stale', ''
  end
  local tenant, flow, entry = row[5], row[6], row[7]

  if row[10] == '1' then
    bury(tenant, id, consumer, row[13])
    return 'deleted', ''
  end
  if outcome == 'abandoned' then
    local how = recover(id, row, now, cap)
    redis.call('HSET', ROW, 'reported', fence)
    return 'recovered', how
  end

  -- The run is over. From here on the row stays, so the report is remembered against a
  -- repeat (`reported`, written with the outcome).

  if row[8] == '1' or outcome == 'cancelled' then
    finish(tenant, flow, id, row, 'cancelled', now, { 'reported', fence }, {})
    return 'done', 'cancelled'
  elseif outcome == 'completed' then
    -- An error of an earlier attempt does not describe a success.
    finish(tenant, flow, id, row, 'completed', now, { 'output', output, 'reported', fence },
      { 'err_kind', 'err_msg' })
    return 'done', 'completed'
  elseif outcome == 'released' then
    redis.call('HSET', ROW, 'reported', fence)
    requeue(tenant, flow, id, now, tonumber(row[3]) - 1, consumer, row[13])
    return 'released', ''
  end

  -- failed
  local exhausted = tonumber(row[3]) >= tonumber(row[4])
  if backoff ~= '' and not exhausted then
    local due = now + tonumber(backoff)
    end_lease(tenant, id, consumer, nil, row[13])
    index_move(tenant, flow, 'running', 'queued', id)
    schedule(tenant, flow, id, due, { 'status', 'queued', 'updated', now,
      'err_kind', err_kind, 'err_msg', err_msg, 'reported', fence })
    notify(id, now)
    return 'retrying', due
  end
  finish(tenant, flow, id, row, 'failed', now,
    { 'err_kind', err_kind, 'err_msg', err_msg, 'reported', fence }, {}, backoff ~= '')
  if backoff ~= '' then
    dead_letter_run(id, tenant, flow, err_kind, row[3], entry, now, err_msg, cap)
    return 'dead_lettered', ''
  end
  return 'done', 'failed'
end

local what, detail = record()
local more, started, wait = 0, {}, nil
if chain > 0 and what ~= 'stale' and what ~= 'repeat' and not barred(consumer, tonumber(ARGV[17])) then
  wait = promote_due(now, 100)
  more, started = start_entries(consumer, chain, ttl, cap, now)
  -- A start that throttled its tenant or key put a wake-up on the timer set.
  if WOKE then wait = nil end
end
flush_trends()
return { what, detail, more, started, wait or next_due(now), eligible_weight() }
