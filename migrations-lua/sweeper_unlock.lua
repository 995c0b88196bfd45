#!lua flags=allow-oom
-- sweeper_unlock.lua: end a sweeper turn: the lock goes only if this process still holds it
-- (after a turn longer than the lock's hold, another process may hold it by now).
-- Composed after guard.lua only (no shard helpers).
--
-- KEYS[1]  frozen: the freeze marker of the {meta} tag, sluice:{meta}:hold (see guard.lua)
-- KEYS[2]  lock: the sweeper lock, sluice:{meta}:sweeper
-- ARGV[1]  prefix: the {meta} prefix, sluice:{meta}:
-- ARGV[2]  owner: the owner name this process took the lock with
--
-- Reply: 1 released, 0 not held by this owner
if redis_call('GET', KEYS[2]) == ARGV[2] then return redis_call('DEL', KEYS[2]) end
return 0
