#!lua flags=allow-oom
-- dlq_dismiss.lua: remove one dead-letter record, once an operator has dealt with it (replayed
-- the execution, or decided to leave it failed). The execution itself is not touched: it stays
-- readable as `failed` until its retention ends. Counted as `dlq_dismissed` in the shard's
-- statistics, so what left the stream other than by the caps is known. The record's id leaves
-- its holder's index and count (see `dead_letter` in common.lua) in the same step.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  dead_letters: the shard's dead-letter stream
-- KEYS[3]  stats: the shard's statistics hash
-- KEYS[4]  dead_letter_holders: the shard's dead-letter counts by holder
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  record: record id, <ms>-<seq> (built from numbers by the caller)
-- ARGV[7]  tenant: only a record of this tenant is removed; '' removes any record (the
--          platform admin, also poison records that belong to no tenant)
--
-- Reply: 1 removed; 0 no such record in this shard (or another tenant's, left alone).
local DLQ = declared(2, K.dlq())
local STATS = declared(3, K.stats())
declared(4, K.dlq_holders())
local id, tenant = ARGV[6], ARGV[7]

local records = redis_call('XRANGE', DLQ, id, id)
if #records == 0 then return 0 end
local owner = record_field(records[1][2], 'tenant_id') or ''
if tenant ~= '' and owner ~= tenant then return 0 end
redis_call('XDEL', DLQ, id)
dlq_unhold(owner, id)
redis_call('HINCRBY', STATS, 'dlq_dismissed', 1)
return 1
