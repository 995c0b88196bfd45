#!lua flags=allow-oom
-- start.lua: read up to `count` new entries of the shard's ready stream for one worker and start
-- each of them, in the same atomic step. So an entry is in the pending list only while a worker
-- is running it (there is no "read but not started" state to recover from), and a worker reads
-- only as many entries as it has free slots. If the reply is lost (time-out), the worker finds
-- what it started with adopt.lua before it starts anything else.
--
-- First, retries whose backoff is over are put back on the ready stream (they kept their slot).
--
-- The doorbell (see ring() in common.lua): a call that read fewer entries than it asked for
-- has emptied the stream of unread entries, so it clears the bell (no idle worker is woken for
-- nothing); one that read all it asked for sets it, so another worker with a free slot is
-- woken for what may remain.
--
-- Each start increments the row's `fence`, the token that heartbeats and completions name: it
-- never repeats for an execution (retry.lua does not reset it), so a run that is no longer
-- current can never pass for the current one. `attempt` counts the starts of the current run.
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the shard's ready stream    KEYS[3]  its retry delays  KEYS[4]  its lease index
-- KEYS[5]  its dead-letter stream      KEYS[6]  its counters
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  consumer name (the worker)
-- ARGV[7]  count: the worker's free slots (>= 1)
-- ARGV[8]  lease TTL, milliseconds
-- ARGV[9]  dead-letter stream cap
--
-- Reply: {more, started}
--   more      1 when the call read as many entries as it asked for (more may be waiting), else 0
--   started   a list of started executions, each
--             {id, fence, attempt, tenant, flow, version or '', params, max_attempts}
local READY, LEASES = declared(2, K.ready()), declared(4, K.leases())
declared(3, K.delayed())
declared(5, K.dlq()); declared(6, K.stats())
local consumer, count, ttl, cap = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local now = now_ms()

promote_due(now, 100)

local read = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', count,
  'STREAMS', READY, '>')
local entries = read and read[1][2] or {}
local more = 0
if #entries < count then
  redis.call('DEL', K.bell())
else
  more = 1
  ring()
end
local started = {}

for _, e in ipairs(entries) do
  local entry, fields = e[1], e[2]
  local id = entry_execution(fields)
  local row = nil
  if id then
    row = redis.call('HMGET', K.row(id), 'status', 'entry', 'attempt', 'max_attempts', 'tenant',
      'flow', 'cancel', 'fence', 'version', 'params', 'watch')
  end
  if not row or not row[1] then
    -- Poison: an entry naming no execution, or one that does not exist. Dead-lettered once
    -- and removed, so it can never loop.
    drop_entry(entry)
    dead_letter({ 'execution_id', id or '', 'reason', 'poison', 'attempts', 0,
      'source_entry', entry, 'at', now, 'message', 'ready entry names no existing execution' }, cap)
  elseif row[1] ~= 'queued' or row[2] ~= entry then
    -- Cancelled, finished or deleted meanwhile, or an entry superseded by a newer one.
    drop_entry(entry)
  elseif row[7] == '1' then
    -- A queued execution is cancelled at once, so this cannot happen; should it, a cancel
    -- still wins over a start.
    local tenant, flow = row[5], row[6]
    drop_entry(entry)
    index_move(tenant, flow, 'queued', 'running', id)
    finish(tenant, flow, id, 'cancelled', now, {}, { 'qstate' })
  else
    local tenant, flow = row[5], row[6]
    local attempt = tonumber(row[3]) + 1
    local fence = (tonumber(row[8]) or 0) + 1
    index_move(tenant, flow, 'queued', 'running', id)
    redis.call('HSET', K.row(id), 'status', 'running', 'attempt', attempt, 'fence', fence,
      'started', now, 'updated', now, 'lease_owner', consumer, 'lease_until', now + ttl)
    redis.call('HDEL', K.row(id), 'qstate')
    redis.call('ZADD', LEASES, now + ttl, id)
    -- As run_of() reports a run, from what was read above (no second read).
    table.insert(started, { id, fence, attempt, tenant, flow, row[9] or '', row[10], row[4] })
    announce(id, row[11], 'running', now)
  end
end
return { more, started }
