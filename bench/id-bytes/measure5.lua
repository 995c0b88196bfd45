-- Sums `MEMORY USAGE <key> SAMPLES 0` over every key by kind (fill5.lua's keys: listing `:ls`,
-- queue `:waiting` or chunks `:w:<n>`, the chunks' directory `:wd`, dedup `:ddb:` buckets and
-- `:dd:` strings, the rest rows), and counts each kind's encodings (`OBJECT ENCODING` of every
-- key, not a sample, so no converted structure hides), the queue's members and the rows'
-- sizes. Reply lines:
--   'sum <kind> <bytes> <keys>'
--   'enc <kind>/<type>/<encoding> <keys>'
--   'members <queued members in :waiting or the chunks>'
--   'rowsize <MEMORY USAGE of a row> <rows>'
local sums, counts, enc, sizes = {}, {}, {}, {}
local members = 0
local cursor = '0'
local t = 'sluice:{s07.19}:t:'
repeat
  local r = redis.call('SCAN', cursor, 'COUNT', 1000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    local kind = 'row'
    if string.sub(k, 1, #t) == t then
      if string.sub(k, -3) == ':ls' then kind = 'listing'
      elseif string.sub(k, -3) == ':wd' then kind = 'directory'
      elseif string.sub(k, -8) == ':waiting' or string.match(k, ':w:%d+$') then
        kind = 'queue'
        members = members + redis.call('ZCARD', k)
      else kind = 'dedup' end
    end
    local bytes = redis.call('MEMORY', 'USAGE', k, 'SAMPLES', 0)
    sums[kind] = (sums[kind] or 0) + bytes
    counts[kind] = (counts[kind] or 0) + 1
    if kind == 'row' then sizes[bytes] = (sizes[bytes] or 0) + 1 end
    local e = kind .. '/' .. redis.call('TYPE', k)['ok'] .. '/'
      .. redis.call('OBJECT', 'ENCODING', k)
    enc[e] = (enc[e] or 0) + 1
  end
until cursor == '0'
local out = { 'members ' .. members }
for k, v in pairs(sums) do table.insert(out, 'sum ' .. k .. ' ' .. v .. ' ' .. counts[k]) end
for k, v in pairs(enc) do table.insert(out, 'enc ' .. k .. ' ' .. v) end
for k, v in pairs(sizes) do table.insert(out, 'rowsize ' .. k .. ' ' .. v) end
return out
