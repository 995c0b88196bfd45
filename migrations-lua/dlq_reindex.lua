#!lua flags=allow-oom
-- dlq_reindex.lua: (re)builds a shard's dead-letter indexes and counts from its stream, one
-- bounded batch of records per call, oldest first. Run by `serve` at start for every shard (see
-- Store::reindex_dead_letters); a shard needs it when
--   - `dead_letters_indexed` exists: an older build left it, naming the first record it
--     indexed; the records below it are in no index, and no record is counted by holder; or
--   - records exist but no holder is counted (a build before tenant indexes, or counts lost).
-- Otherwise the first call answers 'done' at once. While a shard is rebuilt its marker exists;
-- the last batch deletes it (and the set of holders met on the way).
--
-- Each holder's index is deleted the first time this rebuild meets one of its records (the set
-- `dead_letters_rebuilt` remembers whom it met, so that happens once), then its records' ids
-- are appended in the stream's order, so older records join the index in front of the ones an
-- older build had indexed; its count is set to its index's length. Safe to interrupt and to
-- run again, also from several processes at once: an id already appended is refused by the
-- stream (not above its last id) and skipped; a call that finds the marker gone stops. Run
-- with older builds stopped: one writing meanwhile may leave a record out of its index.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  dead_letters: the shard's dead-letter stream
-- KEYS[3]  dead_letters_indexed: the marker: this shard's dead letters are being rebuilt
-- KEYS[4]  dead_letter_holders: its dead-letter counts by holder
-- KEYS[5]  dead_letters_rebuilt: the holders this rebuild has met
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  cursor: '' to begin; else the id of the last record the previous call handled
-- ARGV[7]  batch: the most records to handle in this call
--
-- Reply: {next, indexed}: the cursor to call with next ('done' once the shard is rebuilt or
-- needed nothing), and how many record ids this call appended to an index.
local DLQ = declared(2, K.dlq())
local MARKER = declared(3, K.dlq_indexed())
local HOLDERS = declared(4, K.dlq_holders())
local REBUILT = declared(5, K.dlq_rebuilt())
local cursor, batch = ARGV[6], tonumber(ARGV[7])

local from
if cursor == '' then
  if redis_call('EXISTS', MARKER) == 0 then
    if redis_call('EXISTS', HOLDERS) == 1 or redis_call('XLEN', DLQ) == 0 then
      return { 'done', 0 }
    end
    redis_call('SET', MARKER, 'rebuild')
  end
  from = '-'
else
  -- Another process finished this shard meanwhile.
  if redis_call('EXISTS', MARKER) == 0 then return { 'done', 0 } end
  from = '(' .. cursor
end

local records = redis_call('XRANGE', DLQ, from, '+', 'COUNT', batch)
local indexed = 0
for _, record in ipairs(records) do
  local id = record[1]
  local holder = record_field(record[2], 'tenant_id') or ''
  local index = dlq_index(holder)
  if redis_call('SADD', REBUILT, holder) == 1 then redis_call('DEL', index) end
  local added = redis.pcall('XADD', index, id, 'r', '1')
  if not (type(added) == 'table' and added.err) then indexed = indexed + 1 end
  redis_call('ZADD', HOLDERS, redis_call('XLEN', index), holder)
end
if #records < batch then
  redis_call('DEL', MARKER, REBUILT)
  return { 'done', indexed }
end
return { records[#records][1], indexed }
