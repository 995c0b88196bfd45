#!lua flags=allow-oom
-- abandon.lua: settle an admission whose answer was lost (the admit call timed out or its
-- connection broke after it was sent, so admit.lua may have run, may still run later, or never
-- runs). Either the admission already happened, or it is made impossible from now on: a void
-- marker for the id makes a late admit.lua refuse. Scripts run one at a time, so whichever of
-- the two runs first decides, and the answer of this one is definite either way.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  row: the execution's row
-- KEYS[3]  void: its void marker
-- KEYS[4]  cfg: the tenant's limits, where `void_until` says until when (ms) a void marker of
--          the tenant may exist: admit.lua looks for its own marker only before then, so an
--          admission costs no EXISTS of a marker that is almost never there
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  id: execution id the lost admission minted
-- ARGV[8]  void_ttl_secs: how long the void marker lives, seconds (longer than any call can
--          stay in flight)
--
-- Reply: {'admitted', row} the admission happened (row as HGETALL) | {'void'} it never will
local tenant, id, ttl = ARGV[6], ARGV[7], tonumber(ARGV[8])
local ROW, VOID = declared(2, K.row(id)), declared(3, K.void(id))
local CFG = declared(4, K.cfg(tenant))
if redis_call('HGET', ROW, 't') == tenant then return { 'admitted', view(id) } end
-- The marker and the tenant's `void_until` end at the same instant of Redis's clock; the
-- latter only moves later (an earlier marker of the tenant may outlive this one).
local ends = now_ms() + ttl * 1000
redis_call('SET', VOID, 1, 'PXAT', ends)
local was = tonumber(redis_call('HGET', CFG, 'void_until'))
if not was or was < ends then redis_call('HSET', CFG, 'void_until', ends) end
return { 'void' }
