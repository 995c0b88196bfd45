#!lua flags=allow-oom
-- reschedule.lua: move a scheduled execution (one on the shard's timer set: scheduled for
-- later, or waiting out a retry backoff) to a new due time. A time that has come makes it
-- runnable at once, in its tenant's order by now. Anything else is refused: an execution that
-- is runnable, running or over keeps its place.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  row: the execution's row
-- KEYS[3]  delayed: the shard's timer set
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: the caller's tenant id
-- ARGV[7]  id: execution id
-- ARGV[8]  run_at: the new due time, Unix ms ('' when ARGV[9] gives it)
-- ARGV[9]  delay: the new due time as ms after now ('' when ARGV[8] gives it)
--
-- Reply: {'not_found'} (missing, or another tenant's) | {'not_scheduled', status, qs}
--      | {'ok', id, row}
local tenant, id = ARGV[6], ARGV[7]
local ROW = declared(2, K.row(id))
local DELAYED = declared(3, K.delayed())
local row = redis_call('HMGET', ROW, 't', 's', 'q', 'f', 'pr',
  'dl', 'kh')
if row[1] ~= tenant or row[6] then return { 'not_found' } end
if row[2] ~= 'queued' or row[3] ~= 'scheduled' then
  local qs = ''
  if row[2] == 'queued' then qs = queue_state(tenant, id, row[3]) end
  return { 'not_scheduled', row[2], qs }
end
local now = now_ms()
local due = tonumber(ARGV[8]) or (now + tonumber(ARGV[9]))
redis_call('ZREM', DELAYED, id)
if due <= now then
  index_remove(tenant, row[4], 'scheduled', id)
  redis_call('HDEL', ROW, 'ra')
  make_runnable(tenant, id, now, row[5], { 'u', now }, row[7])
else
  schedule(tenant, row[4], id, due, { 'u', now })
end
notify(id, now)
return { 'ok', id, view(id) }
