#!lua flags=allow-oom
-- sweep.lua: one batch of repairs for one tenant, walking one structure with a SCAN cursor.
-- These repair what should never drift (a crash between Redis and a lost reply cannot cause it,
-- but retention expiry, manual edits and processes of an older build can).
--
--   mode 'slots'   slot-set members whose execution is not running: removed (the slot set
--                  holds running executions only); and, once per walk (its first batch), the
--                  same for the running sets of the tenant's blocked concurrency keys (a
--                  stale member there would hold its key forever), each key then offered
--                  again
--   mode 'waiting' queue members whose execution is gone or no longer runnable: removed
--   mode 'reach'   every queued execution (its listing's 'queued' members) must be reachable from
--                  the shard's structures — on the timer set when scheduled, in its tenant's
--                  queue otherwise; one that is not (e.g. left on a ready stream by a process
--                  of the stream-model build) is put back where its row says
--   mode 'index'   listing members (see "Listing" in common.lua) whose row expired, moved on
--                  or is not of their status, flow and tenant: removed; the flow of one kept
--                  missing from the tenant's flows set (which status-only pages read the
--                  flows from): added. Cursor: the last member walked (the walk is lexical,
--                  in batches of `batch` members)
--   mode 'usage'   the tenant's storage counters (see "Storage" in common.lua) recounted in
--                  this one call: the logical bytes of its queued and running executions read
--                  from their rows, plus its expiry buckets after a drain; a repair when they
--                  had drifted (an execution ended by a process of an older build, a
--                  configuration deleted with its counters). Only for a tenant with at most
--                  `batch` queued and running executions (bounded work; the others keep
--                  their counters until a pass finds them so small)
--   mode 'dedup'   the tenant's buckets of live dedup mappings (K.dedup_bucket() in
--                  common.lua), about `batch` fields a call, bucket by bucket: a field whose
--                  execution ended (by a process of an older build, which ends only the
--                  string-key form) moves to the string key with the dedup TTL, as
--                  dedup_end() would have done; one whose execution is gone, deleted or not
--                  its own is dropped. Cursor '<bucket>:<HSCAN cursor>'; a tenant without
--                  buckets costs one EXISTS
-- Every mode ends by putting the tenant in or out of the runnable set as its state says, and
-- in or out of the shard's busy set (out when it has nothing queued or running). A tenant
-- being deleted (tenant_drop.lua) is not swept: tenant_reap.lua removes what it holds, and a
-- repair would put some of it back.
-- (Also written, names built inside from the prefix: the shard's busy set, the tenant's
-- expiry buckets.)
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  stats: the shard's counters
-- KEYS[3]  cfg: the tenant's limits
-- KEYS[4]  slots: its slot set
-- KEYS[5]  waiting: its queue
-- KEYS[6]  runnable: the shard's runnable tenants
-- KEYS[7]  leases: the shard's lease index
-- KEYS[8..] index: in mode 'index' only, the tenant's listing; none otherwise
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  mode: the walk (see SweepMode in src/store/sweep.rs)
-- ARGV[8]  cursor: '0' to begin (modes 'reach' and 'index': the last listing member walked)
-- ARGV[9]  batch: batch size hint
--
-- Reply: {next_cursor ('0' when done), repaired}
local tenant, mode = ARGV[6], ARGV[7]
local cursor, count = ARGV[8], ARGV[9]
local STATS = declared(2, K.stats())
local CFG = declared(3, K.cfg(tenant))
if redis_call('HEXISTS', CFG, 'deleting') == 1 then return { '0', 0 } end
local SLOTS, WAITING = declared(4, K.slots(tenant)), declared(5, K.waiting(tenant))
declared(6, K.runnable()); declared(7, K.leases())
local repaired = 0

-- Every repair is counted per shard (see the queue statistics).
local function counted(reply)
  if reply[2] > 0 then redis_call('HINCRBY', STATS, 'repaired_' .. mode, reply[2]) end
  refresh(tenant)
  -- A tenant left with nothing queued or running leaves the shard's busy set (terminal
  -- changes do not take it out: see the trends block of common.lua); one with work is in it
  -- (work an older build queued, or a member lost to a repair, is listed again).
  if listing_count(tenant, 'queued') == 0 and listing_count(tenant, 'running') == 0 then
    redis_call('SREM', K.busy(), tenant)
  else
    mark_busy(tenant)
  end
  return reply
end

if mode == 'slots' then
  local r = redis_call('SSCAN', SLOTS, cursor, 'COUNT', count)
  for _, id in ipairs(r[2]) do
    if redis_call('HGET', K.row(id), 's') ~= 'running' then
      redis_call('SREM', SLOTS, id)
      repaired = repaired + 1
    end
  end
  if cursor == '0' then
    -- Blocked keys, a bounded number per walk (the rest at the next).
    for _, h in ipairs(redis_call('SRANDMEMBER', K.key_blocked(tenant), 100)) do
      for _, id in ipairs(redis_call('SMEMBERS', K.key_running(tenant, h))) do
        if redis_call('HGET', K.row(id), 's') ~= 'running' then
          redis_call('SREM', K.key_running(tenant, h), id)
          repaired = repaired + 1
        end
      end
      key_offer(tenant, h)
    end
  end
  return counted({ r[1], repaired })
elseif mode == 'waiting' then
  local r = redis_call('ZSCAN', WAITING, cursor, 'COUNT', count)
  for i = 1, #r[2], 2 do
    local id = r[2][i]
    local row = redis_call('HMGET', K.row(id), 's', 'q', 't')
    if row[1] ~= 'queued' or row[2] == 'scheduled' or row[3] ~= tenant then
      redis_call('ZREM', WAITING, id)
      repaired = repaired + 1
    end
  end
  return counted({ r[1], repaired })
elseif mode == 'reach' then
  local now = now_ms()
  local min, max = listing_range('queued')
  if cursor ~= '0' then min = '(' .. cursor end
  local members = redis_call('ZRANGE', K.listing(tenant), min, max, 'BYLEX', 'LIMIT', 0, count)
  local r = { '0' }
  if #members >= tonumber(count) then r[1] = members[#members] end
  for _, m in ipairs(members) do
    local _, _, id = listing_parse(m)
    local row = redis_call('HMGET', K.row(id or ''), 's', 'q', 'f', 'ra',
      'r', 'c', 'pr', 't', 'kh')
    local key = row[9]
    if row[1] == 'queued' and row[8] == tenant then
      local scheduled = row[2] == 'scheduled' or redis_call('ZSCORE', K.delayed(), id)
      if scheduled then
        if not redis_call('ZSCORE', K.delayed(), id) or row[2] ~= 'scheduled' then
          local due = tonumber(redis_call('ZSCORE', K.delayed(), id)) or tonumber(row[4]) or now
          redis_call('ZREM', K.waiting(tenant), id)
          if key then redis_call('ZREM', K.key_queue(tenant, key), id) end
          schedule(tenant, row[3], id, due, { 'u', now })
          repaired = repaired + 1
        end
      elseif key then
        -- A keyed one is reachable from its key's queue (its tenant's order holds only the
        -- key's first, see "Concurrency keys" in common.lua).
        if not redis_call('ZSCORE', K.key_queue(tenant, key), id) then
          redis_call('ZREM', WAITING, id)
          make_runnable(tenant, id, tonumber(row[5] or row[6]) or now, row[7], nil, key)
          repaired = repaired + 1
        else
          key_offer(tenant, key)
        end
      elseif not redis_call('ZSCORE', WAITING, id) then
        -- 'queued', 'waiting' (its old name), or a stream-model 'dispatched'.
        redis_call('HDEL', K.row(id), 'e')
        make_runnable(tenant, id, tonumber(row[5] or row[6]) or now, row[7])
        repaired = repaired + 1
      end
    end
  end
  return counted({ r[1], repaired })
elseif mode == 'usage' then
  if listing_count(tenant, 'queued') + listing_count(tenant, 'running') > tonumber(count) then
    return counted({ '0', 0 })
  end
  local live = 0
  for _, state in ipairs({ 'queued', 'running' }) do
    local min, max = listing_range(state)
    for _, m in ipairs(redis_call('ZRANGE', K.listing(tenant), min, max, 'BYLEX')) do
      local _, _, id = listing_parse(m)
      -- Counted once, from the member of its status (a stale member elsewhere is not it).
      local r = redis_call('HMGET', K.row(id or ''), 'z', 't', 's', 'em', 'dl')
      if r[1] and r[2] == tenant and r[3] == state and not r[5] then
        live = live + tonumber(r[1]) + #(r[4] or '')
      end
    end
  end
  local u = drain(tenant, now_ms())
  local drained = {}
  for _, f in ipairs(u.drained or drained) do drained[f] = true end
  local bytes, rows = live, 0
  local all = redis_call('HGETALL', K.retained(tenant))
  for i = 1, #all, 2 do
    local b, r = string.match(all[i + 1], '^(-?%d+):(-?%d+)$')
    if b and not drained[all[i]] then
      bytes, rows = bytes + tonumber(b), rows + tonumber(r)
    end
  end
  local had_bytes, had_rows = u.bytes + u.d_bytes, u.rows + u.d_rows
  if bytes ~= had_bytes or rows ~= had_rows then
    u.d_bytes, u.d_rows = u.d_bytes + bytes - had_bytes, u.d_rows + rows - had_rows
    repaired = 1
  end
  flush_usage()
  return counted({ '0', repaired })
elseif mode == 'dedup' then
  local b, c = 0, '0'
  if cursor ~= '0' then
    local bs, cs = string.match(cursor, '^(%d+):(%d+)$')
    b, c = tonumber(bs), cs
    if not b then return redis.error_reply('ERR sluice sweep: dedup cursor ' .. cursor) end
  end
  if cursor == '0' then
    local names = {}
    for i = 0, 255 do names[i + 1] = K.dedup_bucket(tenant, string.format('%02x', i)) end
    if redis_call('EXISTS', unpack(names)) == 0 then return counted({ '0', 0 }) end
  end
  local seen, limit = 0, tonumber(count)
  while true do
    local h = string.format('%02x', b)
    local bucket = K.dedup_bucket(tenant, h)
    local r = redis_call('HSCAN', bucket, c, 'COUNT', limit)
    for i = 1, #r[2], 2 do
      local field, mapped = r[2][i], r[2][i + 1]
      local digest = h .. field
      local id = mapping_id(mapped)
      local row = redis_call('HMGET', K.row(id or ''), 's', 't', 'dh', 'dl')
      -- (The row's `dh` is the digest's 16 bytes at layout 5: digest_hex().)
      if not id or row[2] ~= tenant or (row[3] and digest_hex(row[3])) ~= digest or row[4] then
        redis_call('HDEL', bucket, field)
        repaired = repaired + 1
      elseif row[1] ~= 'queued' and row[1] ~= 'running' then
        redis_call('HDEL', bucket, field)
        local key = K.dedup(tenant, digest)
        local there = redis_call('GET', key)
        if not there or maps_to(there, id) then
          redis_call('SET', key, mapped, 'EX', DEDUP_TTL_SECS)
        end
        repaired = repaired + 1
      end
      seen = seen + 1
    end
    c = r[1]
    if c == '0' then
      if b == 255 then return counted({ '0', repaired }) end
      b = b + 1
    end
    if seen >= limit then return counted({ b .. ':' .. c, repaired }) end
  end
else
  local LISTING = declared(8, K.listing(tenant))
  local min = '-'
  if cursor ~= '0' then min = '(' .. cursor end
  local members = redis_call('ZRANGE', LISTING, min, '+', 'BYLEX', 'LIMIT', 0, count)
  local flows = {}
  for _, m in ipairs(members) do
    local s, f, id = listing_parse(m)
    local row = redis_call('HMGET', K.row(id or ''), 's', 'f', 't', 'q', 'dl')
    local ok = s and row[2] == f and row[3] == tenant and not row[5]
    if s == 'scheduled' then
      ok = ok and row[1] == 'queued' and row[4] == 'scheduled'
    else
      ok = ok and row[1] == s
    end
    if not ok then
      redis_call('ZREM', LISTING, m)
      repaired = repaired + 1
    elseif not flows[f] then
      flows[f] = true
      repaired = repaired + redis_call('SADD', K.flows(tenant), f)
    end
  end
  local next_cursor = '0'
  if #members >= tonumber(count) then next_cursor = members[#members] end
  return counted({ next_cursor, repaired })
end
