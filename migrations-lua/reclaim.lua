-- reclaim.lua: recover executions whose lease expired (the worker died or stalled), reading
-- only expired leases from the shard's lease index: the cost follows the orphans, never the
-- number of running executions. A live lease is never touched: no XCLAIM, no delivery count
-- or attempt change. An orphan goes back on the ready stream (a new entry; the next start makes
-- it attempt+1), or, when its attempts are used up, is dead-lettered as 'lease_lost'. One whose
-- cancel was requested ends cancelled.
--
-- KEYS[1]  the shard's lease index (routing only)
-- ARGV[1..4] common (see common.lua)
-- ARGV[5]  most orphans to handle in this call
-- ARGV[6]  dead-letter stream cap
--
-- Reply: {requeued, dead_lettered}
local batch, cap = tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', K.leases(), '-inf', now, 'LIMIT', 0, batch)
local requeued, dead = 0, 0
for _, id in ipairs(expired) do
  local row = redis.call('HMGET', K.row(id), 'status', 'attempt', 'max_attempts', 'tenant', 'flow',
    'entry', 'cancel')
  if row[1] ~= 'running' then
    -- Finished or deleted without its lease entry going (repair): nothing to recover.
    redis.call('ZREM', K.leases(), id)
  else
    local tenant, flow, entry = row[4], row[5], row[6]
    drop_entry(entry)
    if row[7] == '1' then
      -- Its cancel was requested while it ran: running it again would only stop it again.
      finish(tenant, flow, id, 'cancelled', now, {}, {})
    elseif tonumber(row[2]) >= tonumber(row[3]) then
      local msg = 'lease expired on attempt ' .. row[2] .. ' of ' .. row[3]
      finish(tenant, flow, id, 'failed', now, { 'err_kind', 'lease_lost', 'err_msg', msg }, {})
      dead_letter({ 'execution_id', id, 'tenant_id', tenant, 'flow_id', flow,
        'reason', 'lease_lost', 'attempts', row[2], 'source_entry', entry or '', 'at', now,
        'message', msg }, cap)
      dead = dead + 1
    else
      requeue(tenant, flow, id, now)
      redis.call('HINCRBY', K.stats(), 'reclaimed', 1)
      requeued = requeued + 1
    end
  end
end
return { requeued, dead }
