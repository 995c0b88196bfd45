-- complete.lua: record the end of one attempt, fenced by the attempt number: a worker whose
-- attempt is no longer current (it was reclaimed while paused) changes nothing.
--
-- KEYS[1]  the execution's row key (routing only)
-- ARGV[1..4] common (see common.lua)
-- ARGV[5]  execution id
-- ARGV[6]  attempt the worker ran (the fencing token)
-- ARGV[7]  outcome: 'completed' | 'failed' | 'cancelled' | 'released'
--          (released: the worker is shutting down; the execution goes back on the ready stream)
-- ARGV[8]  output JSON (completed), '' otherwise
-- ARGV[9]  error kind (failed), e.g. 'handler_error'
-- ARGV[10] error message (failed)
-- ARGV[11] retry backoff in ms when the failure may be retried, '' when it may not
-- ARGV[12] dead-letter stream cap
--
-- Reply:
--   {'stale'}               the attempt is not current; nothing changed (counted in stats)
--   {'done', status}        terminal now: completed, failed or cancelled
--   {'dead_lettered'}       failed with attempts exhausted: terminal failed + dead-letter record
--   {'retrying', due_ms}    failed, attempts left: queued again after the backoff
--   {'released'}            back on the ready stream for another worker
local id, attempt, outcome = ARGV[5], ARGV[6], ARGV[7]
local output, err_kind, err_msg, backoff = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local cap = tonumber(ARGV[12])

local row = redis.call('HMGET', K.row(id), 'status', 'attempt', 'max_attempts', 'tenant', 'flow',
  'entry')
if row[1] ~= 'running' or row[2] ~= attempt then
  redis.call('HINCRBY', K.stats(), 'fenced', 1)
  return { 'stale' }
end
local tenant, flow, entry = row[4], row[5], row[6]
local now = now_ms()

-- The attempt is over: its entry leaves the pending list and the stream.
drop_entry(entry)

if outcome == 'completed' then
  -- An error of an earlier attempt does not describe a success.
  finish(tenant, flow, id, 'completed', now, { 'output', output }, { 'err_kind', 'err_msg' })
  return { 'done', 'completed' }
elseif outcome == 'cancelled' then
  finish(tenant, flow, id, 'cancelled', now, {}, {})
  return { 'done', 'cancelled' }
elseif outcome == 'released' then
  requeue(tenant, flow, id, now)
  return { 'released' }
end

-- failed
local exhausted = tonumber(attempt) >= tonumber(row[3])
if backoff ~= '' and not exhausted then
  local due = now + tonumber(backoff)
  end_lease(id)
  index_move(tenant, flow, 'running', 'queued', id)
  redis.call('HSET', K.row(id), 'status', 'queued', 'qstate', 'dispatched', 'updated', now,
    'err_kind', err_kind, 'err_msg', err_msg)
  redis.call('ZADD', K.delayed(), due, id)
  return { 'retrying', due }
end
finish(tenant, flow, id, 'failed', now, { 'err_kind', err_kind, 'err_msg', err_msg }, {})
if backoff ~= '' then
  dead_letter({ 'execution_id', id, 'tenant_id', tenant, 'flow_id', flow,
    'reason', err_kind, 'attempts', attempt, 'source_entry', entry or '', 'at', now,
    'message', err_msg }, cap)
  return { 'dead_lettered' }
end
return { 'done', 'failed' }
