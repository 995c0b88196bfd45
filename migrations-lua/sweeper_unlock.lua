-- sweeper_unlock.lua: end a sweeper turn: the lock goes only if this process still holds it
-- (after a turn longer than the lock's hold, another process may hold it by now).
-- Runs on its own (without common.lua).
--
-- KEYS[1]  the sweeper lock, sluice:{meta}:sweeper
-- ARGV[1]  the owner name this process took the lock with
--
-- Reply: 1 released, 0 not held by this owner
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
