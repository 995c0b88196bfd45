-- Sums `MEMORY USAGE <key> SAMPLES 0` over every key by kind (fill.lua's keys: listing `:ls`,
-- queue `:waiting`, dedup `:ddb:` buckets and `:dd:` strings, the rest rows) and counts each
-- kind's encodings. Reply: 'kind bytes keys' lines, then 'enc kind/encoding keys' lines.
local sums, counts, enc = {}, {}, {}
local cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'COUNT', 1000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    local kind = 'row'
    if string.sub(k, 1, 18) == 'sluice:{s07.19}:t:' then
      if string.sub(k, -3) == ':ls' then kind = 'listing'
      elseif string.sub(k, -8) == ':waiting' then kind = 'queue'
      else kind = 'dedup' end
    end
    sums[kind] = (sums[kind] or 0) + redis.call('MEMORY', 'USAGE', k, 'SAMPLES', 0)
    counts[kind] = (counts[kind] or 0) + 1
    local e = kind .. '/' .. redis.call('OBJECT', 'ENCODING', k)
    enc[e] = (enc[e] or 0) + 1
  end
until cursor == '0'
local out = {}
for k, v in pairs(sums) do table.insert(out, k .. ' ' .. v .. ' ' .. counts[k]) end
for k, v in pairs(enc) do table.insert(out, 'enc ' .. k .. ' ' .. v) end
return out
