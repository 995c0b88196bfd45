-- layout/3_compact_rows.lua: one batch of layout migration 3 (`sluice migrate-layout`): rows
-- of layouts 1 and 2 get their compact names (see "Rows" in common.lua). Not an operation of
-- the library: `src/migrate.rs` runs it (EVALSHA) while the shard is held, so no script of
-- either build runs beside it.
--
-- Two forms:
--   KEYS[1]  an index of one shard: a tenant's status index (sorted set) or its `deleting`
--            set; rows are found through it
--   ARGV[1]  'index'
--   ARGV[2]  the shard's prefix (rows are <prefix>exec:<id>)
--   ARGV[3]  the first rank to read (a set is read whole at rank 0)
--   ARGV[4]  how many ids to read
--   ARGV[5..] pairs: a field's layout-2 name, its layout-3 name (src/domain/row.rs, LEGACY)
--   Reply    {1 when the index is done (else read on from ARGV[3] + ARGV[4]), rows converted}
-- or
--   KEYS     rows, of one hash tag (what a SCAN found)
--   ARGV[1]  'keys'
--   ARGV[2..4] ignored
--   ARGV[5..] the pairs
--   Reply    {1, rows converted}
--
-- Safe to repeat: a row without `status` is converted already (or gone) and left alone. A
-- row is changed in place (HSET the new names, then HDEL the old ones), so it keeps its expiry
-- (a terminal row's PEXPIRETIME, which its retention bucket was chosen by) and never empties
-- on the way. Fields equal to their default are dropped (the readers supply them): attempt
-- 0, the default priority, queue state `queued`, updated and ready_at equal to created. Names
-- not in the table are left as they are.
local short = {}
for i = 5, #ARGV, 2 do short[ARGV[i]] = ARGV[i + 1] end

local function convert(key)
  local row = redis.call('HGETALL', key)
  local created, legacy = nil, false
  for i = 1, #row, 2 do
    if row[i] == 'status' then legacy = true
    elseif row[i] == 'created' then created = row[i + 1] end
  end
  if not legacy then return 0 end
  local set, del = {}, {}
  for i = 1, #row, 2 do
    local f, v = row[i], row[i + 1]
    local s = short[f]
    if s and s ~= f then
      del[#del + 1] = f
      local default = (f == 'attempt' and v == '0') or (f == 'priority' and v == '3')
        or (f == 'qstate' and v == 'queued')
        or ((f == 'updated' or f == 'ready_at') and v == created)
      if not default then
        set[#set + 1] = s
        set[#set + 1] = v
      end
    end
  end
  redis.call('HSET', key, unpack(set))
  redis.call('HDEL', key, unpack(del))
  return 1
end

local converted = 0
if ARGV[1] == 'keys' then
  for _, key in ipairs(KEYS) do converted = converted + convert(key) end
  return { 1, converted }
end
local first, count = tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('TYPE', KEYS[1]).ok == 'set' then
  -- A tenant's force-deleted runs still running: few, read whole.
  if first == 0 then
    for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
      converted = converted + convert(ARGV[2] .. 'exec:' .. id)
    end
  end
  return { 1, converted }
end
local ids = redis.call('ZRANGE', KEYS[1], first, first + count - 1)
for _, id in ipairs(ids) do converted = converted + convert(ARGV[2] .. 'exec:' .. id) end
return { #ids < count and 1 or 0, converted }
