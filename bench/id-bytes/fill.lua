-- Writes what admit.lua (and, for 'completed', the end of a run) leaves on Redis for executions
-- ARGV[1] .. ARGV[1] + ARGV[2] - 1 of demo.echo with ~30-byte params and a dedup key, over
-- ARGV[5] tenants of one shard: the row, its listing member, its queue member and its dedup
-- mapping, in key layout 4's shapes (common.lua, "Rows"; docs/DESIGN.md, "Keys") with the id
-- as 32 hex characters (ARGV[3] '0') or as its 16 bytes (ARGV[3] '1'), the row's key
-- `<p><ARGV[4]><id>`. Only the id-bearing parts differ between the variants, so the growth
-- of used_memory between two of them is what binary ids (or a shorter row prefix) save.
-- ARGV[6] 'queued' (a live mapping in its bucket, on the queue) or 'completed' (a retained
-- row, its mapping a string key with the dedup TTL, off the queue). ARGV[7] '1' also stores
-- the dedup digest (row field `dh`) and the request fingerprint as bytes, the mapping's value
-- then `<id><8-byte fingerprint>` (fixed widths need no separator).
local from, n, binary, rowp = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4]
local tenants, done, packed = tonumber(ARGV[5]), ARGV[6] == 'completed', ARGV[7] == '1'
local p = 'sluice:{s07.19}:'
local base = 1796000000000
local function bytes(hex)
  return (string.gsub(hex, '..', function(h) return string.char(tonumber(h, 16)) end))
end
for i = from, from + n - 1 do
  -- A UUIDv7: 48 bits of milliseconds, version 7, variant 10, random bits.
  local ms = base + math.floor(i / 10)
  local b, t = {}, ms
  for k = 6, 1, -1 do b[k] = t % 256; t = math.floor(t / 256) end
  b[7], b[8], b[9] = 0x70 + math.random(0, 15), math.random(0, 255), 0x80 + math.random(0, 63)
  for k = 10, 16 do b[k] = math.random(0, 255) end
  local hex = {}
  for k = 1, 16 do hex[k] = string.format('%02x', b[k]) end
  local id = binary and string.char(unpack(b)) or table.concat(hex)
  local tenant = 'bench' .. (i % tenants)
  local dh = string.sub(redis.sha1hex('k' .. i), 1, 32)
  local params = string.format('{"n":%d,"pad":"%s"}', i, string.rep('x', 14 - #tostring(i)))
  local fingerprint = string.sub(redis.sha1hex('f' .. i), 1, 16)
  local mapping = packed and id .. bytes(fingerprint) or id .. ':' .. fingerprint
  local row = { 't', tenant, 'f', 'demo.echo', 'p', params, 'm', '5', 'c', tostring(ms),
    'z', tostring(512 + #params), 'd', 'mem-' .. i, 'dh', packed and bytes(dh) or dh }
  if done then
    for _, v in ipairs({ 's', 'completed', 'a', '1', 'st', tostring(ms + 3), 'fi',
      tostring(ms + 5), 'u', tostring(ms + 5), 'o', '{"n":' .. i .. '}' }) do
      table.insert(row, v)
    end
    redis.call('ZADD', p .. 't:' .. tenant .. ':ls', 0, 'cdemo.echo\0' .. id)
    redis.call('SET', p .. 't:' .. tenant .. ':dd:' .. dh, mapping, 'EX', 604800)
  else
    table.insert(row, 's'); table.insert(row, 'queued')
    redis.call('ZADD', p .. 't:' .. tenant .. ':ls', 0, 'qdemo.echo\0' .. id)
    redis.call('ZADD', p .. 't:' .. tenant .. ':waiting', ms, id)
    redis.call('HSET', p .. 't:' .. tenant .. ':ddb:' .. string.sub(dh, 1, 2),
      string.sub(dh, 3), mapping)
  end
  redis.call('HSET', p .. rowp .. id, unpack(row))
end
return n
