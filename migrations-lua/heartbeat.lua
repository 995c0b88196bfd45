#!lua flags=allow-oom
-- heartbeat.lua: extend the leases one worker holds in one shard, in one call, and tell it
-- which executions it must stop. A lease is extended only for the current run (its fence) and
-- only for the worker holding it.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  leases: the shard's lease index
-- KEYS[3..] rows: the row of each execution named in ARGV[8..], in order
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  lease_ttl_ms: lease TTL, milliseconds
-- ARGV[7]  consumer: the worker's consumer name
-- ARGV[8]  tenant: the tenant whose runs these must be (a pull worker's, or the platform
--          admin's acting for a tenant: a run of another tenant is 'lost' to it); '' for any
-- ARGV[9..] held: pairs of execution id and fence of the run the worker holds
--
-- Reply: one answer per pair, in order:
--   'ok'      lease extended
--   'cancel'  lease extended, but the execution was cancelled or force-deleted: stop and
--             report the run as cancelled
--   'lost'    the run is no longer current (reclaimed, finished, retried): stop; any result of
--             this run will be refused
local LEASES = declared(2, K.leases())
local ttl, consumer, tenant = tonumber(ARGV[6]), ARGV[7], ARGV[8]
local now = now_ms()
local answers = {}
for i = 9, #ARGV, 2 do
  local id, fence = ARGV[i], ARGV[i + 1]
  local ROW = declared(3 + (i - 9) / 2, K.row(id))
  local row = redis_call('HMGET', ROW, 's', 'fe', 'lo', 'x', 'dl',
    't')
  if row[1] == 'running' and row[2] == fence and row[3] == consumer
    and (tenant == '' or row[6] == tenant) then
    redis_call('ZADD', LEASES, now + ttl, id)
    redis_call('HSET', ROW, 'lu', now + ttl)
    if row[4] == '1' or row[5] == '1' then
      table.insert(answers, 'cancel')
    else
      table.insert(answers, 'ok')
    end
  else
    table.insert(answers, 'lost')
  end
end
return answers
