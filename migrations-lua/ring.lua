#!lua flags=allow-oom
-- ring.lua: set the shard's doorbell again (see `ring` in common.lua) — a worker woke for work
-- it cannot take now, so another worker with a free slot may be woken instead. A script, not
-- a plain ZADD, so that the guard's freeze check comes first: a process still running with an
-- old key layout during `sluice migrate-layout` writes no old-layout key.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  bell: the shard's doorbell
-- ARGV[1..5] common: see common.lua
--
-- Reply: 1
declared(2, K.bell())
ring()
return 1
