-- layout/3_compact_rows.lua: one batch of layout migration 3 (`sluice migrate-layout`): rows
-- of layouts 1 and 2 get their compact names (see "Rows" in common.lua). Not an operation of
-- the library: `src/migrate.rs` runs it (EVALSHA, on the node that holds the shard) while the
-- shard is held, so no script of either build runs beside it.
--
-- KEYS     rows of one shard (one hash tag), as SCAN found them
-- ARGV     pairs: a field's layout-2 name, its layout-3 name (src/domain/row.rs, LEGACY)
-- Reply    the number of rows converted
--
-- Safe to repeat: a row without `status` is converted already (or gone) and left alone. A
-- row is changed in place (HSET the new names, then HDEL the old ones), so it keeps its TTL
-- (a terminal row's PEXPIRETIME, which its retention bucket was chosen by) and never empties
-- on the way. Fields equal to their default are dropped (the readers supply them): attempt
-- 0, the default priority, queue state `queued`, updated and ready_at equal to created. Names
-- not in the table are left as they are.
local short = {}
for i = 1, #ARGV, 2 do short[ARGV[i]] = ARGV[i + 1] end
local converted = 0
for _, key in ipairs(KEYS) do
  local row = redis.call('HGETALL', key)
  local created, legacy = nil, false
  for i = 1, #row, 2 do
    if row[i] == 'status' then legacy = true
    elseif row[i] == 'created' then created = row[i + 1] end
  end
  if legacy then
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
    converted = converted + 1
  end
end
return converted
