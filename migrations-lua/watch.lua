#!lua flags=allow-oom
-- watch.lua: a server starts waiting on one execution of a tenant (GET
-- /api/executions/{id}?wait=..., GET /api/executions/{id}/events): until `horizon` ms from now,
-- every change of the execution publishes on its channel (notify() in common.lua). Called
-- once per waiter, after the server subscribed to that channel, so no change can fall
-- between this read and the first message. The row's `watch` field only grows (the latest
-- horizon of all waiters, on every server, wins); a missing row is never created, a
-- terminal one is not written (nothing follows but a retry, and waiters of a terminal
-- execution are answered at once). `allow-oom`: the write is a few bytes on an existing row,
-- and a full Redis should still answer its readers.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  row: the execution's row
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: the caller's tenant id
-- ARGV[7]  id: execution id
-- ARGV[8]  horizon: how long the caller may wait, milliseconds
--
-- Reply: {'not_found'} (missing, another tenant's, or deleted) | {'ok', id, row}
local tenant, id, horizon = ARGV[6], ARGV[7], tonumber(ARGV[8])
local ROW = declared(2, K.row(id))
local row = redis_call('HMGET', ROW, 't', 'dl', 's', 'w')
if row[1] ~= tenant or row[2] then return { 'not_found' } end
if row[3] == 'queued' or row[3] == 'running' then
  local until_ms = now_ms() + horizon
  if not row[4] or tonumber(row[4]) < until_ms then redis_call('HSET', ROW, 'w', until_ms) end
end
return { 'ok', id, view(id) }
