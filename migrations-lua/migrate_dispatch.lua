#!lua flags=allow-oom
-- migrate_dispatch.lua: schema migration 2 ("fair dispatch"), one bounded batch of one shard.
-- Schema 1 kept dispatched executions on a ready stream (consumer group `workers`), each
-- holding a concurrency slot from dispatch on, and retries waiting out a backoff on the timer
-- set with their slot. Schema 2 takes the slot at start and keeps what is runnable in ordered
-- sets (see "Dispatch" in common.lua). Each batch is atomic; an interrupted migration is
-- finished by running it again from the first phase (every phase skips what is done):
--
--   'stream'  each ready-stream entry: a queued execution it carries gives its slot back and
--             joins its tenant's queue (by its admission time: the order it had); a running
--             one is listed in its worker's held set (adopt.lua reads that instead of the
--             stream's pending list). The entry is deleted; the emptied stream goes.
--   'delayed' each retry on the timer set gives its slot back and becomes 'scheduled'.
--   'tenants' each tenant of the shard is put in or out of the runnable set.
-- Executions waiting under schema 1 (qstate 'waiting', scored by admission time) are already
-- in their tenant's queue in order, and stay as they are.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  ready: the shard's ready stream (schema 1)
-- KEYS[3]  delayed: its timer set
-- KEYS[4]  tenants: its tenant set
-- KEYS[5]  runnable: its runnable tenants
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  phase: 'stream', 'delayed' or 'tenants'
-- ARGV[7]  cursor: where the phase goes on ('0' to begin)
-- ARGV[8]  batch: the most members handled in this call
--
-- Reply: {phase, cursor, moved}: the phase and cursor to call with next ('done' when the shard
-- is migrated) and how many executions this call moved.
local READY, DELAYED = declared(2, K.ready()), declared(3, K.delayed())
local TENANTS = declared(4, K.tenants())
declared(5, K.runnable())
local phase, cursor, batch = ARGV[6], ARGV[7], tonumber(ARGV[8])
local now = now_ms()
local moved = 0

if phase == 'stream' then
  if redis_call('TYPE', READY).ok ~= 'stream' then return { 'delayed', '0', 0 } end
  local entries = redis_call('XRANGE', READY, '-', '+', 'COUNT', batch)
  if #entries == 0 then
    redis_call('DEL', READY)
    return { 'delayed', '0', 0 }
  end
  for _, e in ipairs(entries) do
    local entry, fields = e[1], e[2]
    local id = nil
    for i = 1, #fields, 2 do
      if fields[i] == 'id' then id = fields[i + 1] end
    end
    if id then
      local row = redis_call('HMGET', K.row(id), 's', 'e', 't', 'lo',
        'c', 'pr')
      if row[2] == entry and row[1] == 'queued' then
        redis_call('SREM', K.slots(row[3]), id)
        redis_call('HDEL', K.row(id), 'e')
        make_runnable(row[3], id, tonumber(row[5]) or now, row[6])
        moved = moved + 1
      elseif row[2] == entry and row[1] == 'running' then
        if row[4] and row[4] ~= '' then redis_call('SADD', K.held(row[4]), id) end
        redis_call('HDEL', K.row(id), 'e')
        moved = moved + 1
      end
    end
    redis_call('XDEL', READY, entry)
  end
  return { 'stream', '0', moved }
elseif phase == 'delayed' then
  local r = redis_call('ZSCAN', DELAYED, cursor, 'COUNT', batch)
  for i = 1, #r[2], 2 do
    local id, due = r[2][i], tonumber(r[2][i + 1])
    local row = redis_call('HMGET', K.row(id), 's', 'q', 't', 'f')
    if row[1] == 'queued' and row[2] == 'dispatched' then
      redis_call('SREM', K.slots(row[3]), id)
      index_add(row[3], row[4], 'scheduled', id)
      redis_call('HSET', K.row(id), 'q', 'scheduled', 'ra', due)
      moved = moved + 1
    end
  end
  if r[1] == '0' then return { 'tenants', '0', moved } end
  return { 'delayed', r[1], moved }
else
  local r = redis_call('SSCAN', TENANTS, cursor, 'COUNT', batch)
  for _, t in ipairs(r[2]) do refresh(t) end
  if r[1] == '0' then return { 'done', '0', moved } end
  return { 'tenants', r[1], moved }
end
