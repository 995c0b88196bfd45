#!lua flags=allow-oom
-- cancel.lua: cancel one execution of a tenant.
--   queued  -> 'cancelled' now: off its queue (its tenant's order or the timer set).
--   running -> 'cancel_requested' set; the worker holding it is told at once (tell_holder in
--              common.lua) and stops it, and no path (retry backoff, reclaim, release) runs it
--              again: it ends cancelled.
--   terminal -> unchanged (cancel is idempotent).
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  row: the execution's row
-- KEYS[3]  cfg: the tenant's limits
-- KEYS[4]  slots: its slot set
-- KEYS[5]  waiting: its queue
-- KEYS[6]  listing: its listing (K.listing() in common.lua)
-- KEYS[7]  runnable: the shard's runnable tenants
-- KEYS[8]  delayed: its timer set
-- KEYS[9]  stats: its counters
-- (A cancel also counts in the trends counters, goes to the tenant's webhook outbox, and
-- retains the row in the tenant's storage counters: names built inside, see common.lua.)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: the caller's tenant id
-- ARGV[7]  id: execution id
--
-- Reply: {'not_found'} (missing, or another tenant's) | {'ok', id, row}
local tenant, id = ARGV[6], ARGV[7]
local ROW = declared(2, K.row(id))
declared(3, K.cfg(tenant)); declared(4, K.slots(tenant)); declared(5, K.waiting(tenant))
declared(6, K.listing(tenant))
declared(7, K.runnable()); declared(8, K.delayed())
local STATS = declared(9, K.stats())
local row = redis_call('HMGET', ROW, 't', 's', 'q', 'e', 'f',
  'dl', 'kh', 'z')
if row[1] ~= tenant or row[6] then return { 'not_found' } end
local status, qstate, entry, flow = row[2], row[3], row[4], row[5]

local now = now_ms()
if status == 'queued' then
  unqueue(tenant, flow, id, qstate, row[7])
  index_move(tenant, flow, 'queued', 'cancelled', id)
  redis_call('HSET', ROW, 's', 'cancelled', 'x', 1, 'fi', now,
    'u', now)
  redis_call('HDEL', ROW, 'q', 'e')
  -- Retained with its logical size (see "Storage" in common.lua): an error message of an
  -- earlier attempt stays in the row.
  local size = tonumber(row[8])
  if size then size = size + redis_call('HSTRLEN', ROW, 'em') end
  -- (A binary `dh`, layout 5: the row has `fp` too, see dedup_end().)
  local digest = redis_call('HGET', ROW, 'dh')
  local fp = digest and #digest == 16 and redis_call('HGET', ROW, 'fp') or nil
  settle_terminal(tenant, id, digest, size, nil, fp)
  local attempt = redis_call('HGET', ROW, 'a') or '0'
  outbox(tenant, id, 'cancelled', now, { 'flow', flow, 'attempt', attempt })
  redis_call('HINCRBY', STATS, 'cancelled', 1)
  tally(tenant, 'cancelled', now)
elseif status == 'running' then
  local run = redis_call('HMGET', ROW, 'x', 'lo')
  if run[1] ~= '1' then
    redis_call('HSET', ROW, 'x', 1, 'u', now)
    tell_holder(run[2], id)
  end
end
notify(id, now)
flush_trends()
flush_usage()
return { 'ok', id, view(id) }
