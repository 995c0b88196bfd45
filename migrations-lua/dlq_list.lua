#!lua flags=no-writes
-- dlq_list.lua: one page of a shard's dead-letter records, newest first, older than a record
-- id when given: one tenant's (read through its index of record ids, so its shard neighbours'
-- records are never read), or every record of the shard (the platform admin's listing). The
-- work is bounded by the page, never by the stream: at most `limit` ids or records.
--
-- Redis 7.0's XREVRANGE walks the whole stream when its end lies below the stream's first
-- node (it then starts from the last one): so the first id is read first (XRANGE - + COUNT 1,
-- O(log n)), and a bound at or below it answers "nothing older" without that walk.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  dead_letters: the shard's dead-letter stream
-- KEYS[3]  dead_letter_holders: its dead-letter counts by holder
-- KEYS[4]  stats: its counters
-- KEYS[5]  dead_letters_evicted: its records evicted by holder
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: the tenant whose records are listed; '' for every record of the shard
-- ARGV[7]  before: only records older than this id (<ms>-<seq>, canonical numbers as Redis
--          writes them); '' for no bound
-- ARGV[8]  limit: the most records to return, 0..200 (0: the counts alone)
--
-- Reply: {held, evicted, ...}: `held` the records the tenant holds now (the shard's records
-- for ''), `evicted` those of its records the caps evicted so far (the shard's `dlq_evicted`
-- for ''); then, for a tenant, the ids of the page (its index's, at most `limit`: the caller
-- reads their records, natively, which costs Redis a fraction of what reading them here and
-- converting them to Lua and back would), or for '' the page's records, each as XRANGE gives
-- it (id, fields).
local DLQ = declared(2, K.dlq())
local HOLDERS = declared(3, K.dlq_holders())
local STATS = declared(4, K.stats())
local EVICTED = declared(5, K.dlq_evicted())
local tenant, before, limit = ARGV[6], ARGV[7], tonumber(ARGV[8])

-- Whether decimal a < b (canonical digits: no leading zeros).
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- Whether record id a <= b.
local function at_or_below(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if am ~= bm then return less(am, bm) end
  return as == bs or less(as, bs)
end

-- Up to n entries of `stream` older than `bound` ('' for none), newest first, without the walk
-- an end below the stream's first entry would cost.
local function older(stream, bound, n)
  local first = redis_call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
  if not first then return {} end
  if bound ~= '' and at_or_below(bound, first[1]) then return {} end
  local top = '+'
  if bound ~= '' then top = '(' .. bound end
  return redis_call('XREVRANGE', stream, top, '-', 'COUNT', n)
end

local out
if tenant == '' then
  out = { redis_call('XLEN', DLQ), tonumber(redis_call('HGET', STATS, 'dlq_evicted')) or 0 }
  for _, record in ipairs(older(DLQ, before, limit)) do
    table.insert(out, record[1])
    table.insert(out, record[2])
  end
  return out
end

out = { tonumber(redis_call('ZSCORE', HOLDERS, tenant)) or 0,
  tonumber(redis_call('HGET', EVICTED, tenant)) or 0 }
for _, entry in ipairs(older(K.tenant_dlq(tenant), before, limit)) do
  table.insert(out, entry[1])
end
return out
