-- common.lua: helpers of every shard script (composed after guard.lua, which has already
-- checked ARGV[1] and KEYS against each other and refused while the shard is frozen). Not an
-- operation on its own.
--
-- Calling convention shared by every shard script (see guard.lua for KEYS[1] and ARGV[1]):
--   ARGV[1]  the shard prefix, e.g. "sluice:{s07}:"
--   ARGV[2]  server default max_concurrent (used when the tenant has no own value)
--   ARGV[3]  server default max_queued
--   ARGV[4]  retention of terminal rows, seconds
--   ARGV[5]  how long a dedup key keeps mapping to its execution once that is terminal, seconds
--   ARGV[6..] operation-specific, documented in each file.
--   KEYS[1]  the shard's freeze marker; KEYS[2..] the keys the operation names, each read
--            through declared(i, K.<builder>(...)), which checks it is the name the builders
--            below give: declared and used keys cannot drift apart.
--
-- Key names mirror src/store/keys.rs; change both together (a test runs these builders
-- against the Rust ones).
-- Lua has no rollback: every script decides first and writes after.

local DEFAULT_MAX_CONCURRENT = tonumber(ARGV[2])
local DEFAULT_MAX_QUEUED = tonumber(ARGV[3])
local RETENTION_SECS = tonumber(ARGV[4])
local DEDUP_TTL_SECS = tonumber(ARGV[5])

local K = {}
function K.ready() return P .. 'ready' end
function K.row(id) return P .. 'exec:' .. id end
function K.cfg(t) return P .. 't:' .. t .. ':cfg' end
function K.slots(t) return P .. 't:' .. t .. ':slots' end
function K.waiting(t) return P .. 't:' .. t .. ':waiting' end
function K.deleting(t) return P .. 't:' .. t .. ':deleting' end
function K.status_idx(t, s) return P .. 't:' .. t .. ':st:' .. s end
function K.flow_idx(t, f, s) return P .. 't:' .. t .. ':fl:' .. f .. ':' .. s end
function K.dedup(t, h) return P .. 't:' .. t .. ':dd:' .. h end
function K.flows(t) return P .. 't:' .. t .. ':flows' end
function K.tenants() return P .. 'tenants' end
function K.leases() return P .. 'leases' end
function K.delayed() return P .. 'delayed' end
function K.dlq() return P .. 'dlq' end
function K.tenant_dlq(t) return P .. 't:' .. t .. ':dlq' end
function K.dlq_indexed() return P .. 'dlq_indexed' end
function K.stats() return P .. 'stats' end
function K.void(id) return P .. 'void:' .. id end
function K.frozen() return P .. 'frozen' end
function K.bell() return P .. 'bell' end
function K.adopted(consumer) return P .. 'adopted:' .. consumer end

-- KEYS[i], which the caller must have declared as `expected` (the builders' name for it).
-- Called at the top of a script, before any write.
local function declared(i, expected)
  if KEYS[i] ~= expected then
    error('sluice: KEYS[' .. i .. '] is ' .. tostring(KEYS[i]) .. ', expected ' .. expected)
  end
  return KEYS[i]
end

-- The consumer group every worker reads the ready stream through.
local GROUP = 'workers'

local STATUSES = { 'queued', 'running', 'completed', 'failed', 'cancelled' }

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Tells the servers waiting on an execution that it changed (the block at the end: waiters).
local notify, announce
-- Per-minute counters of what happened (the block at the end: trends).
local tally, tally_start, mark_busy

-- The tenant's effective limits: its own values where set, else the server defaults.
-- Also whether the tenant is pinned to another shard (pin.lua): then its number.
local function limits(t)
  local v = redis.call('HMGET', K.cfg(t), 'max_concurrent', 'max_queued', 'enabled', 'pinned')
  return tonumber(v[1]) or DEFAULT_MAX_CONCURRENT, tonumber(v[2]) or DEFAULT_MAX_QUEUED,
    v[3] ~= '0', v[4]
end

local function index_add(t, flow, status, id)
  redis.call('ZADD', K.status_idx(t, status), 0, id)
  redis.call('ZADD', K.flow_idx(t, flow, status), 0, id)
end

local function index_remove(t, flow, status, id)
  redis.call('ZREM', K.status_idx(t, status), id)
  redis.call('ZREM', K.flow_idx(t, flow, status), id)
end

-- The shard's doorbell: a marker (a sorted set of one member) that a worker with a free slot
-- waits on (BZPOPMIN, on a connection of its own), so new work wakes it at once instead of
-- being polled for. Every entry put on the ready stream sets it (one command, a no-op when it
-- is set already); Redis hands it to one waiting worker, whose start call sets it again while
-- more is left (so the next idle worker is woken in turn) and clears it once the stream holds
-- no unread entry (see start.lua). A marker taken by a worker that then died is set again by
-- the orphan scan (reclaim.lua). The key is the ready stream's companion and always built here
-- from the shard prefix.
local function ring()
  redis.call('ZADD', K.bell(), 0, 1)
end

-- Whether the shard's ready stream holds entries no worker has read yet: those after the
-- consumer group's last-delivered id. Exact (deleted entries do not count), and O(1). A stream
-- without the group (it was replaced, e.g. restored without its group) holds nothing anyone
-- has read: any entry counts, so a worker is woken and creates the group again.
local function undelivered()
  local groups = redis.call('XINFO', 'GROUPS', K.ready())
  for _, g in ipairs(groups) do
    local name, last = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] end
      if g[i] == 'last-delivered-id' then last = g[i + 1] end
    end
    if name == GROUP then
      return #redis.call('XRANGE', K.ready(), '(' .. last, '+', 'COUNT', 1) > 0
    end
  end
  return redis.call('XLEN', K.ready()) > 0
end

-- Puts a queued execution on the shard's ready stream. `fields` (optional) are more fields
-- of the row the caller writes, set in the same HSET.
local function dispatch_entry(id, now, fields)
  local entry = redis.call('XADD', K.ready(), '*', 'id', id)
  redis.call('HSET', K.row(id), 'qstate', 'dispatched', 'entry', entry, 'updated', now,
    unpack(fields or {}))
  ring()
end

-- Retries whose backoff is over go back on the ready stream (they kept their slot), at most
-- `most` per call.
local function promote_due(now, most)
  local due = redis.call('ZRANGEBYSCORE', K.delayed(), '-inf', now, 'LIMIT', 0, most)
  for _, id in ipairs(due) do
    redis.call('ZREM', K.delayed(), id)
    if redis.call('HGET', K.row(id), 'status') == 'queued' then dispatch_entry(id, now) end
  end
end

-- Tells the worker holding a running execution's lease to look at it now (a cancel or a force
-- delete): the worker subscribes to this channel and asks Redis (a heartbeat) what to do, so
-- the message only shortens the wait for its next heartbeat and is safe to lose.
local function tell_holder(owner, id)
  if owner and owner ~= '' then redis.call('PUBLISH', 'sluice:stop:' .. owner, id) end
end

-- Gives a queued execution a slot of its tenant and puts it on the ready stream.
local function dispatch(t, id, now, fields)
  redis.call('SADD', K.slots(t), id)
  dispatch_entry(id, now, fields)
end

-- Fills free slots of tenant t from its waiting set, oldest first, handling at most `budget`
-- members (so one call stays short). Members whose row is gone or no longer waiting are
-- dropped (repair). Returns true when more could be dispatched now (room left and somebody
-- still waiting): the caller continues in another call.
local function promote(t, now, budget)
  -- The common case on every release: nobody waits.
  if redis.call('EXISTS', K.waiting(t)) == 0 then return false end
  local max_concurrent = limits(t)
  local free = max_concurrent - redis.call('SCARD', K.slots(t))
  while free > 0 do
    if budget <= 0 then return redis.call('EXISTS', K.waiting(t)) == 1 end
    budget = budget - 1
    local popped = redis.call('ZPOPMIN', K.waiting(t))
    if #popped == 0 then return false end
    local id = popped[1]
    local row = redis.call('HMGET', K.row(id), 'status', 'qstate', 'watch')
    if row[1] == 'queued' and row[2] == 'waiting' then
      dispatch(t, id, now)
      announce(id, row[3], 'queued', now)
      free = free - 1
    end
  end
  return false
end

-- Members promote() handles in a call made for one release or admission.
local PROMOTE_BUDGET = 100

-- The quota decision of an admission (and of a retry): where a new queued execution of t goes.
-- FIFO: while anybody of t waits, a newcomer waits behind them, whatever room there is; room
-- is first given to the oldest waiting (bounded). Returns 'dispatched' or 'waiting', or nil
-- and a refusal ('disabled'; 'full' with the waiting count; 'moved' with the shard a pinned
-- tenant lives in now, see pin.lua). Writes nothing but promotions.
local function place(t, now)
  local max_concurrent, max_queued, enabled, pinned = limits(t)
  if pinned then return nil, 'moved', pinned end
  if not enabled then return nil, 'disabled' end
  promote(t, now, PROMOTE_BUDGET)
  local waiting = redis.call('ZCARD', K.waiting(t))
  if waiting == 0 and redis.call('SCARD', K.slots(t)) < max_concurrent then
    return 'dispatched'
  end
  if waiting >= max_queued then return nil, 'full', waiting end
  return 'waiting'
end

-- Enqueues a queued execution where place() decided, writing `fields` of its row (besides
-- its queue state) in the same HSET: an admission writes its whole row in one command.
local function enqueue(t, id, qstate, now, fields)
  if qstate == 'dispatched' then
    dispatch(t, id, now, fields)
  else
    redis.call('ZADD', K.waiting(t), now, id)
    redis.call('HSET', K.row(id), 'qstate', 'waiting', unpack(fields))
  end
end

-- Releases the slot id holds (if any) and dispatches the tenant's oldest waiting executions
-- into the room made. Set membership makes a second release a no-op.
local function release_slot(t, id, now)
  if redis.call('SREM', K.slots(t), id) == 1 then
    promote(t, now, PROMOTE_BUDGET)
  end
end

-- Takes a queued execution off its queue: the stream entry if dispatched (it has not been read:
-- workers start what they read in the same step) or its retry delay, the waiting set otherwise.
local function unqueue(t, id, qstate, entry, now)
  if qstate == 'dispatched' then
    if entry and entry ~= '' then redis.call('XDEL', K.ready(), entry) end
    redis.call('ZREM', K.delayed(), id)
    release_slot(t, id, now)
  else
    redis.call('ZREM', K.waiting(t), id)
  end
end

-- Moves an execution between the status indexes (and the per-flow ones).
local function index_move(t, flow, from, to, id)
  index_remove(t, flow, from, id)
  index_add(t, flow, to, id)
end

-- Acknowledges and deletes a stream entry: once handled it must not stay pending or linger.
local function drop_entry(entry)
  if entry and entry ~= '' then
    redis.call('XACK', K.ready(), GROUP, entry)
    redis.call('XDEL', K.ready(), entry)
  end
end

-- Ends the lease of a running execution: out of the lease index, lease and entry fields gone
-- (the caller has dropped the entry itself).
local function end_lease(id)
  redis.call('ZREM', K.leases(), id)
  redis.call('HDEL', K.row(id), 'entry', 'lease_owner', 'lease_until')
end

-- Puts a running execution back on the ready stream (it keeps its slot). `attempt` is what
-- the row's attempt becomes: the same when the run counted (its lease was lost), one less
-- when it did not (a graceful release). The fence is never lowered.
local function requeue(t, flow, id, now, attempt)
  end_lease(id)
  index_move(t, flow, 'running', 'queued', id)
  redis.call('HSET', K.row(id), 'status', 'queued', 'attempt', attempt, 'updated', now)
  dispatch_entry(id, now)
  notify(id, now)
end

-- The value of field `name` in a flat {field, value, ...} list (a stream record), or nil.
local function record_field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end

-- Most records one call evicts by hand (each leaving its tenant's index too); more are only
-- over the cap after the cap was lowered, and XADD's own trim takes those.
local DLQ_EVICT_BUDGET = 100

-- Appends a record to the shard's dead-letter stream, capped at `cap` entries (exact trim, so
-- the number evicted is known and counted: nothing leaves silently). A tenant's record is
-- also indexed in the tenant's own stream of record ids (same ids, `K.tenant_dlq`), so that
-- listing one tenant's dead letters reads only its own records, not its shard neighbours'; an
-- evicted record leaves its tenant's index in the same step. `K.dlq_indexed` keeps the first
-- record id written with the index: older records (from a build without it) are found by
-- scanning below it.
local function dead_letter(record, cap)
  local dlq = K.dlq()
  local before = redis.call('XLEN', dlq)
  local over = math.min(before + 1 - cap, DLQ_EVICT_BUDGET)
  if over > 0 then
    for _, old in ipairs(redis.call('XRANGE', dlq, '-', '+', 'COUNT', over)) do
      local owner = record_field(old[2], 'tenant_id')
      if owner and owner ~= '' then redis.call('XDEL', K.tenant_dlq(owner), old[1]) end
      redis.call('XDEL', dlq, old[1])
    end
  end
  local id = redis.call('XADD', dlq, 'MAXLEN', cap, '*', unpack(record))
  redis.call('SET', K.dlq_indexed(), id, 'NX')
  local tenant = record_field(record, 'tenant_id')
  if tenant and tenant ~= '' then
    -- Ids only grow in a stream; one that cannot follow the index's last (a shard stream
    -- deleted by hand, then a clock set back) is left out and counted rather than fail the
    -- call that dead-letters.
    local added = redis.pcall('XADD', K.tenant_dlq(tenant), 'MAXLEN', cap, id, 'r', '1')
    if type(added) == 'table' and added.err then
      redis.call('HINCRBY', K.stats(), 'dlq_unindexed', 1)
    end
  end
  local evicted = before + 1 - redis.call('XLEN', dlq)
  if evicted > 0 then redis.call('HINCRBY', K.stats(), 'dlq_evicted', evicted) end
  redis.call('HINCRBY', K.stats(), 'dead_lettered', 1)
end

-- Dead-letters a run that failed for good (complete.lua) or lost its last lease (recover()):
-- the record names the execution, why and after how many attempts, and the stream entry it ran
-- from.
local function dead_letter_run(id, t, flow, reason, attempts, entry, now, message, cap)
  dead_letter({ 'execution_id', id, 'tenant_id', t, 'flow_id', flow, 'reason', reason,
    'attempts', attempts, 'source_entry', entry or '', 'at', now, 'message', message }, cap)
end

-- A row became terminal: its dedup key (if it still maps to it) now lives DEDUP_TTL_SECS more
-- and the row itself RETENTION_SECS. Until this moment neither expires. `digest` is the row's
-- `ddh` field (nil for none), which the caller has read already.
local function settle_terminal(t, id, digest)
  if digest then
    local key = K.dedup(t, digest)
    local mapped = redis.call('GET', key)
    if mapped and string.sub(mapped, 1, #id + 1) == id .. ':' then
      redis.call('EXPIRE', key, DEDUP_TTL_SECS)
    end
  end
  redis.call('EXPIRE', K.row(id), RETENTION_SECS)
end

-- Makes a running execution terminal: status, times, result, index, lease gone, slot released
-- (oldest waiting dispatched), retention and dedup TTLs. `extra` holds fields to set besides
-- the status and times; `drop` names fields to remove besides the lease's. The caller has
-- already dropped its stream entry. The hot path of every completion: one read, one write and
-- one delete of the row, whatever the outcome.
local function finish(t, flow, id, status, now, extra, drop)
  local row = K.row(id)
  local known = redis.call('HMGET', row, 'watch', 'ddh')
  redis.call('ZREM', K.leases(), id)
  index_move(t, flow, 'running', status, id)
  redis.call('HSET', row, 'status', status, 'finished', now, 'updated', now, unpack(extra))
  redis.call('HDEL', row, 'entry', 'lease_owner', 'lease_until', unpack(drop))
  announce(id, known[1], status, now)
  release_slot(t, id, now)
  settle_terminal(t, id, known[2])
  redis.call('HINCRBY', K.stats(), status, 1)
  tally(t, status, now)
end

-- The end of a run whose row was force-deleted while it ran (`deleted` is set): the row was
-- kept only so that its slot stays taken until the handler stopped or its lease expired. Now
-- both go.
local function bury(t, id, entry, now)
  drop_entry(entry)
  redis.call('SREM', K.deleting(t), id)
  redis.call('ZREM', K.leases(), id)
  release_slot(t, id, now)
  redis.call('DEL', K.row(id))
end

-- Fields recover() and complete.lua read from a running row, in this order.
local RUN_FIELDS = { 'status', 'fence', 'attempt', 'max_attempts', 'tenant', 'flow', 'entry',
  'cancel', 'lease_owner', 'deleted' }

-- What happens to a running execution whose run ended without a result (its lease expired, or
-- its worker could no longer renew it): a cancelled one ends cancelled, a force-deleted one is
-- buried, one with attempts left goes back on the ready stream (the lost run counted as an
-- attempt), the rest are dead-lettered as 'lease_lost'. `row` holds RUN_FIELDS. Returns
-- 'requeued', 'dead_lettered', 'cancelled' or 'buried'.
local function recover(id, row, now, cap)
  local tenant, flow, entry = row[5], row[6], row[7]
  if row[10] == '1' then
    bury(tenant, id, entry, now)
    return 'buried'
  end
  drop_entry(entry)
  if row[8] == '1' then
    finish(tenant, flow, id, 'cancelled', now, {}, {})
    return 'cancelled'
  end
  local attempt, max_attempts = tonumber(row[3]), tonumber(row[4])
  if attempt >= max_attempts then
    local msg = 'lease expired on attempt ' .. attempt .. ' of ' .. max_attempts
    finish(tenant, flow, id, 'failed', now, { 'err_kind', 'lease_lost', 'err_msg', msg }, {})
    dead_letter_run(id, tenant, flow, 'lease_lost', attempt, entry, now, msg, cap)
    return 'dead_lettered'
  end
  requeue(tenant, flow, id, now, attempt)
  redis.call('HINCRBY', K.stats(), 'reclaimed', 1)
  return 'requeued'
end

-- The execution id a ready-stream entry carries (its fields as XREADGROUP/XRANGE give them).
local function entry_execution(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'id' then return fields[i + 1] end
  end
  return nil
end

-- A started run as start.lua and adopt.lua report it:
-- {id, fence, attempt, tenant, flow, version or '', params, max_attempts}.
local function run_of(id)
  local r = redis.call('HMGET', K.row(id), 'fence', 'attempt', 'tenant', 'flow', 'version',
    'params', 'max_attempts')
  return { id, r[1], r[2], r[3], r[4], r[5] or '', r[6], r[7] }
end

-- Reads up to `count` new entries of the shard's ready stream for `consumer` and starts each,
-- in the same atomic step (start.lua, and complete.lua for the slot a run just freed): so an
-- entry is in the pending list only while a worker is running it, and a worker reads only as
-- many entries as it has free slots.
--
-- The doorbell (see ring()): a call that read fewer entries than it asked for has emptied the
-- stream of unread entries, so it clears the bell (no idle worker is woken for nothing); one
-- that read all it asked for sets it, so another worker with a free slot is woken for what may
-- remain.
--
-- Each start increments the row's `fence`, the token that heartbeats and completions name: it
-- never repeats for an execution (retry.lua does not reset it), so a run that is no longer
-- current can never pass for the current one. `attempt` counts the starts of the current run.
--
-- Returns more (1 when it read as many entries as it asked for, else 0) and the started runs,
-- each {id, fence, attempt, tenant, flow, version or '', params, max_attempts} (as run_of()).
-- Whether a worker's start-capable call numbered `call` (0: unnumbered) is covered by the
-- barrier its last adopt.lua wrote: such a call had its answer lost and reaches Redis only now,
-- after the worker asked what it holds, so it must start nothing (nobody would run it).
local function barred(consumer, call)
  if call == 0 then return false end
  return call <= (tonumber(redis.call('GET', K.adopted(consumer))) or 0)
end

local function start_entries(consumer, count, ttl, cap, now)
  local read = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', count,
    'STREAMS', K.ready(), '>')
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
      row = redis.call('HMGET', K.row(id), 'status', 'entry', 'attempt', 'max_attempts',
        'tenant', 'flow', 'cancel', 'fence', 'version', 'params', 'watch')
    end
    if not row or not row[1] then
      -- Poison: an entry naming no execution, or one that does not exist. Dead-lettered once
      -- and removed, so it can never loop.
      drop_entry(entry)
      dead_letter({ 'execution_id', id or '', 'reason', 'poison', 'attempts', 0,
        'source_entry', entry, 'at', now, 'message', 'ready entry names no existing execution' },
        cap)
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
      redis.call('ZADD', K.leases(), now + ttl, id)
      -- As run_of() reports a run, from what was read above (no second read).
      table.insert(started, { id, fence, attempt, tenant, flow, row[9] or '', row[10], row[4] })
      announce(id, row[11], 'running', now)
      tally_start(tenant, id, now)
    end
  end
  return more, started
end

local function hgetall(id)
  return redis.call('HGETALL', K.row(id))
end

-- ------------------------------------------------------------------------------------------
-- Waiters: telling the servers that wait on an execution (GET /api/executions/{id}?wait=...,
-- GET /api/executions/{id}/events) that it changed. watch.lua records in the row's `watch`
-- field until when (ms, Redis time) somebody waits; every change of an execution's status or
-- queue state calls notify(), which publishes on the execution's channel only while that is
-- in the future, so an execution nobody waits on costs one HMGET per change and nothing
-- else. PUBLISH is not a key operation: on a cluster Redis forwards it to every node, so a
-- server subscribed on any node hears it. The message is the new status (or 'deleted'); a
-- server re-reads the row anyway, so it only says that something changed.
--
-- The channel name mirrors src/store/keys.rs (events_channel).
local EVENTS_CHANNEL = 'sluice:ev:'

-- Publishes `what` for execution id when `watch` (the row's field, or nil) is in the future.
announce = function(id, watch, what, now)
  if watch and tonumber(watch) > now then
    redis.call('PUBLISH', EVENTS_CHANNEL .. id, what)
  end
end

-- After a change of execution id's row: tells its waiters, if it has any.
notify = function(id, now)
  local row = redis.call('HMGET', K.row(id), 'watch', 'status')
  announce(id, row[1], row[2], now)
end

-- Before execution id's row is deleted (or hidden as deleted): tells its waiters it is gone.
local function notify_deleted(id, now)
  announce(id, redis.call('HGET', K.row(id), 'watch'), 'deleted', now)
end

-- ------------------------------------------------------------------------------------------
-- Trends: per-minute counters of each tenant, and of the whole shard, written by the scripts
-- that change state (no extra round trip): admissions, starts, completions, failures (dead
-- letters included), cancellations, and a histogram of the waiting time of starts.
--
-- One string per tenant per UTC day (K.trends), one per shard per day (K.shard_trends), each
-- of 1440 fixed-size records (one per minute of the day), updated with BITFIELD ... OVERFLOW
-- SAT (a counter stops at its largest value, never wraps). A record is TREND_RECORD_BITS
-- bits: five u32 counters (TREND_FIELD), then from bit TREND_WAIT_AT eight u16 counts of
-- starts by waiting time (upper bounds TREND_WAIT_BOUNDS ms; the eighth holds every longer
-- wait).
-- 1440 x 36 bytes = 51,840 bytes at most per key: a tenant costs at most one such key per
-- day it was active. A day key expires 25 hours after its day ends (EXPIREAT, the same value
-- on every write), so the last 24 hours can always be read.
--
-- K.busy is the shard's set of tenants that may have queued or running executions (added at
-- admission and start, removed by a terminal change that leaves none): readers list "tenants
-- with work now" from it, registered or not, and check each member's indexes (a member may
-- be stale: a force delete of the last execution does not remove it).
--
-- The layout mirrors src/store/trends.rs and the key names src/store/keys.rs; change both
-- together. Call sites: admit.lua (admitted), start_entries (a start), finish() (completed,
-- failed, cancelled), cancel.lua (a queued execution cancelled), retry.lua (mark_busy).
function K.trends(t, day) return P .. 't:' .. t .. ':m:' .. day end
function K.shard_trends(day) return P .. 'm:' .. day end
function K.busy() return P .. 'busy' end

local TREND_RECORD_BITS = 288
local TREND_FIELD = { admitted = 0, started = 32, completed = 64, failed = 96, cancelled = 128 }
local TREND_WAIT_AT = 160
local TREND_WAIT_BOUNDS = { 10, 40, 150, 600, 2500, 10000, 30000 }

-- Applies the BITFIELD increments `ops` (offsets within a record) to the record of the minute
-- of `now` in tenant t's day key and in the shard's.
local function trend_add(t, now, ops)
  local day = math.floor(now / 86400000)
  local base = math.floor((now % 86400000) / 60000) * TREND_RECORD_BITS
  local expire_at = (day + 1) * 86400 + 25 * 3600
  for _, key in ipairs({ K.trends(t, day), K.shard_trends(day) }) do
    local args = { 'BITFIELD', key, 'OVERFLOW', 'SAT' }
    for i = 1, #ops, 2 do
      for _, v in ipairs({ 'INCRBY', ops[i], base + ops[i + 1], 1 }) do table.insert(args, v) end
    end
    redis.call(unpack(args))
    redis.call('EXPIREAT', key, expire_at)
  end
end

-- Counts one event of tenant t at `now`: 'admitted', 'completed', 'failed' or 'cancelled'
-- (a start goes through tally_start). A terminal one that leaves the tenant nothing queued or
-- running takes it off the shard's busy set.
tally = function(t, what, now)
  trend_add(t, now, { 'u32', TREND_FIELD[what] })
  if what == 'admitted' then
    redis.call('SADD', K.busy(), t)
  elseif redis.call('ZCARD', K.status_idx(t, 'queued')) == 0
    and redis.call('ZCARD', K.status_idx(t, 'running')) == 0 then
    redis.call('SREM', K.busy(), t)
  end
end

-- Counts the start of execution id of tenant t at `now`, and its waiting time: from the row's
-- `created` (its admission) to now.
tally_start = function(t, id, now)
  local created = tonumber(redis.call('HGET', K.row(id), 'created')) or now
  local wait = now - created
  local bucket = #TREND_WAIT_BOUNDS
  for i, bound in ipairs(TREND_WAIT_BOUNDS) do
    if wait <= bound then
      bucket = i - 1
      break
    end
  end
  trend_add(t, now, { 'u32', TREND_FIELD.started, 'u16', TREND_WAIT_AT + 16 * bucket })
  redis.call('SADD', K.busy(), t)
end

-- Tenant t has queued work again without an admission (a retry).
mark_busy = function(t)
  redis.call('SADD', K.busy(), t)
end
