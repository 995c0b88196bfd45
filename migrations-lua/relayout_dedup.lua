#!lua flags=allow-oom
-- relayout_dedup.lua: one bounded batch of converting one shard's dedup mappings from the
-- form of older builds (a string key K.dedup() per mapping, without TTL while its execution
-- is live) to today's (a live mapping is a field of its tenant's bucket, K.dedup_bucket();
-- see dedup_holder() in common.lua). A step of `sluice migrate-layout`, shard by shard.
--
-- Walks the node's keys with SCAN (`batch` is its COUNT) for this shard's string mappings
-- (`<prefix>t:<tenant>:dd:<digest>`). One without a TTL whose execution is live (queued or
-- running, its own tenant and digest, not force-deleted) becomes its bucket's field, in one
-- step with the string key's deletion; one whose execution ended gets the dedup TTL (as the
-- end would have set it); one whose execution is gone goes. A mapping with a TTL (an ended
-- execution's) is already in today's form. So every key is converted at most once and a
-- rerun, after an interruption anywhere, converts what is left; each batch is atomic, and
-- every reader and every end of an execution takes both forms meanwhile, so the step is
-- correct on a serving shard too (a frozen one only makes its batches the whole story).
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- (The mappings and buckets are named inside: they are found by the walk.)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  cursor: the SCAN cursor, '0' to begin
-- ARGV[7]  batch: SCAN's COUNT, at least 1
--
-- Reply: {next_cursor ('0' when the walk is done), converted}
local cursor, batch = ARGV[6], tonumber(ARGV[7])
if not batch or batch < 1 then
  return redis.error_reply('ERR sluice relayout_dedup: batch ' .. tostring(ARGV[7]))
end
local r = redis_call('SCAN', cursor, 'MATCH', P .. 't:*:dd:*', 'COUNT', batch, 'TYPE', 'string')
local converted = 0
for _, key in ipairs(r[2]) do
  local tenant, digest = string.match(string.sub(key, #P + 1), '^t:([^:]+):dd:(%x+)$')
  if tenant and #digest == 32 and redis_call('TTL', key) == -1 then
    local mapped = redis_call('GET', key)
    local id = mapped and mapping_id(mapped)
    local row = redis_call('HMGET', K.row(id or ''), 's', 't', 'dh', 'dl')
    local mine = id and row[2] == tenant and (row[3] and digest_hex(row[3])) == digest
      and not row[4]
    if mine and (row[1] == 'queued' or row[1] == 'running') then
      local bucket, field = K.dedup_bucket(tenant, digest), dedup_field(digest)
      -- A field already there (written by this build's admission) is the newer word.
      redis_call('HSETNX', bucket, field, mapped)
      redis_call('DEL', key)
      converted = converted + 1
    elseif mine then
      redis_call('EXPIRE', key, DEDUP_TTL_SECS)
    else
      redis_call('DEL', key)
    end
  end
end
return { r[1], converted }
