-- heartbeat.lua: extend the leases one worker holds in one shard, in one call, and tell it
-- which executions it must stop.
--
-- KEYS[1]  the shard's lease index (routing only)
-- ARGV[1..4] common (see common.lua)
-- ARGV[5]  lease TTL, milliseconds
-- ARGV[6..] pairs: execution id, attempt the worker runs
--
-- Reply: one answer per pair, in order:
--   'ok'      lease extended
--   'cancel'  lease extended, but a cancel was requested: stop and finish as cancelled
--   'lost'    the attempt is no longer current (reclaimed, deleted, finished): stop; any result
--             of this attempt will be refused
local ttl = tonumber(ARGV[5])
local now = now_ms()
local answers = {}
for i = 6, #ARGV, 2 do
  local id, attempt = ARGV[i], ARGV[i + 1]
  local row = redis.call('HMGET', K.row(id), 'status', 'attempt', 'cancel')
  if row[1] == 'running' and row[2] == attempt then
    redis.call('ZADD', K.leases(), now + ttl, id)
    redis.call('HSET', K.row(id), 'lease_until', now + ttl)
    if row[3] == '1' then table.insert(answers, 'cancel') else table.insert(answers, 'ok') end
  else
    table.insert(answers, 'lost')
  end
end
return answers
