#!lua flags=allow-oom
-- ensure_group.lua: create the `workers` consumer group on the shard's ready stream (and the
-- stream with it) when missing. A script, not a plain XGROUP CREATE ... MKSTREAM, so that the
-- guard's freeze check comes first: a process still running with an old key layout while
-- `sluice migrate-layout` moves it (its shards frozen) must not bring an old ready stream back
-- empty — the migration would find it and take it for data.
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2]  the shard's ready stream
-- ARGV[1..5] common (see common.lua)
--
-- Reply: 1 created, 0 it existed
local ok = redis.pcall('XGROUP', 'CREATE', declared(2, K.ready()), GROUP, '0', 'MKSTREAM')
if type(ok) == 'table' and ok.err then
  if string.find(ok.err, '^BUSYGROUP') then return 0 end
  return redis.error_reply(ok.err)
end
return 1
