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
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  id: execution id the lost admission minted
-- ARGV[8]  void_ttl_secs: how long the void marker lives, seconds (longer than any call can
--          stay in flight)
--
-- Reply: {'admitted', row} the admission happened (row as HGETALL) | {'void'} it never will
local tenant, id, ttl = ARGV[6], ARGV[7], tonumber(ARGV[8])
local ROW, VOID = declared(2, K.row(id)), declared(3, K.void(id))
if redis.call('HGET', ROW, 't') == tenant then return { 'admitted', view(id) } end
redis.call('SET', VOID, 1, 'EX', ttl)
return { 'void' }
