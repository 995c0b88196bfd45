#!lua flags=allow-oom
-- adopt.lua: what one worker holds in a shard according to Redis. A worker that lost the reply
-- of its start call (time-out, broken connection) cannot know what that call started; it calls
-- this before starting anything else there, and runs (adopts) whatever it holds but does not
-- know of. So a start whose answer was lost never turns into a phantom run that burns an
-- attempt or a false 'lease_lost' dead letter a lease later.
--
-- The worker's held set (K.held) is exactly what it started and has not finished (start.lua
-- adds a run in the step that starts it; every end of a lease removes it), so this costs what
-- the worker holds, never what the shard holds.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  held: the worker's held set
-- KEYS[3]  leases: the shard's lease index
-- KEYS[4]  adopted: the worker's adoption barrier (K.adopted(consumer))
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  consumer: the worker's consumer name
-- ARGV[7]  most: the most entries to look at (the worker's concurrency is enough)
-- ARGV[8]  lease_ttl_ms: lease TTL, milliseconds: each lease found is extended from now, so
--          the worker's own deadline can be counted from this call
-- ARGV[9]  barrier: the number of the worker's last start-capable call in the shard. Recorded
--          (it only rises; kept a day) so that any of those calls that reaches Redis after this
--          one starts nothing (see barred() in common.lua): with calls spread over several
--          connections, Redis may run a delayed start after this adopt, and what it started
--          would then be known to nobody until its lease expired.
-- ARGV[10..] only: optional, the only tenants whose runs to look at (a pull lease that serves
--          these, see POST /api/worker/lease); none given: every run the worker holds. A run
--          of another tenant is left as it is: not handed out and its lease not extended, so
--          it comes back by its lease's end unless the worker heartbeats it (it knows of it).
--
-- Reply: a list of the executions the consumer holds, each as in start.lua:
--   {id, fence, attempt, tenant, flow, version or '', params, max_attempts,
--    traceparent or '', tracestate or ''}
local consumer, count, ttl = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local HELD, LEASES = declared(2, K.held(consumer)), declared(3, K.leases())
local BARRIER, barrier = declared(4, K.adopted(consumer)), tonumber(ARGV[9])
if barrier > (tonumber(redis_call('GET', BARRIER)) or 0) then
  redis_call('SET', BARRIER, barrier, 'PX', 86400000)
end
local only = nil
if #ARGV > 9 then
  only = {}
  for i = 10, #ARGV do only[ARGV[i]] = true end
end
local now = now_ms()
local held = {}
for _, id in ipairs(redis_call('SMEMBERS', HELD)) do
  local row = redis_call('HMGET', K.row(id), 's', 'lo', 'dl', 't')
  if row[1] == 'running' and row[2] == consumer and not row[3] then
    if #held < count and (not only or only[row[4]]) then
      redis_call('ZADD', LEASES, now + ttl, id)
      redis_call('HSET', K.row(id), 'lu', now + ttl)
      table.insert(held, run_of(id))
    end
  else
    -- Ended without leaving the set (repair): not this worker's any more.
    redis_call('SREM', HELD, id)
  end
end
return held
