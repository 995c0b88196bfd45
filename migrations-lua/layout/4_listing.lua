-- layout/4_listing.lua: one batch of layout migration 4 (`sluice migrate-layout`): a tenant's
-- status indexes and flow indexes (layouts 1-3) become its listing (see "Listing" in
-- common.lua: one member `<status char><flow>\0<id>` per execution, a second under 's' while
-- it is scheduled). Not an operation of the library: `src/migrate.rs` runs it (EVALSHA)
-- after the shard's rows are compact (layout 3), while the shard is held, so no script of
-- either build runs beside it.
--
-- Two forms:
--   KEYS[1]  an old status index of one tenant (queued, running, completed, failed,
--            cancelled, or the scheduled ones')
--   KEYS[2]  the tenant's listing
--   KEYS[3]  the tenant's set of flows
--   ARGV[1]  'index'
--   ARGV[2]  the shard's prefix (rows are <prefix>exec:<id>)
--   ARGV[3]  the tenant id
--   ARGV[4]  the status the index lists ('scheduled' for the scheduled ones)
--   ARGV[5]  how many ids to move at most
--   Reply    {1 when the index is gone (else call again), members written}
-- or
--   KEYS     the tenant's flow indexes (every status of every flow of its flows set, and the
--            status indexes: all of them duplicates of what the listing holds now)
--   ARGV[1]  'drop'
--   Reply    {1, 0}
--
-- Safe to repeat and to interrupt: each id is listed (ZADD of a member that may be there
-- already) before it leaves the old index, so an index half moved is moved on by the next
-- call. An id is listed only as what its row says (its tenant, status, queue state and flow):
-- a member whose row expired, moved on or was force-deleted is dropped, as the sweeper would.
-- Its flow joins the flows set (it is there already unless something removed it by hand):
-- the listing's readers find a flow's members through that set.
if ARGV[1] == 'drop' then
  if #KEYS > 0 then redis.call('UNLINK', unpack(KEYS)) end
  return { 1, 0 }
end
local index, listing, flows = KEYS[1], KEYS[2], KEYS[3]
local prefix, tenant, status = ARGV[2], ARGV[3], ARGV[4]
local count = tonumber(ARGV[5])
local chars = { queued = 'q', running = 'r', completed = 'c', failed = 'f', cancelled = 'x',
  scheduled = 's' }
local c = chars[status]
if not c or not count or count < 1 then
  return redis.error_reply('ERR sluice layout 4: status ' .. tostring(status) .. ', count ' ..
    tostring(ARGV[5]))
end
local ids = redis.call('ZRANGE', index, 0, count - 1)
local written = 0
for _, id in ipairs(ids) do
  local row = redis.call('HMGET', prefix .. 'exec:' .. id, 't', 's', 'f', 'q', 'dl')
  local ok = row[1] == tenant and row[3] and not row[5]
  if status == 'scheduled' then
    ok = ok and row[2] == 'queued' and row[4] == 'scheduled'
  else
    ok = ok and row[2] == status
  end
  if ok then
    written = written + redis.call('ZADD', listing, 0, c .. row[3] .. '\0' .. id)
    redis.call('SADD', flows, row[3])
  end
end
if #ids > 0 then redis.call('ZREM', index, unpack(ids)) end
if #ids < count then return { 1, written } end
return { 0, written }
