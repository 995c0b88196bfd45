-- abandon.lua: settle an admission whose answer was lost (the admit call timed out or its
-- connection broke after it was sent, so admit.lua may have run, may still run later, or never
-- runs). Either the admission already happened, or it is made impossible from now on: a void
-- marker for the id makes a late admit.lua refuse. Scripts run one at a time, so whichever of
-- the two runs first decides, and the answer of this one is definite either way.
--
-- KEYS[1]  the execution's row key (routing only)
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  tenant id
-- ARGV[7]  execution id the lost admission minted
-- ARGV[8]  how long the void marker lives, seconds (longer than any call can stay in flight)
--
-- Reply: {'admitted', row} the admission happened (row as HGETALL) | {'void'} it never will
local tenant, id, ttl = ARGV[6], ARGV[7], tonumber(ARGV[8])
if redis.call('HGET', K.row(id), 'tenant') == tenant then return { 'admitted', hgetall(id) } end
redis.call('SET', K.void(id), 1, 'EX', ttl)
return { 'void' }
