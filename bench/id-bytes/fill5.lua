-- Writes what admit.lua (and, for 'completed', the end of a run) would leave on Redis for
-- executions ARGV[1] .. ARGV[1] + ARGV[2] - 1 of demo.echo with a dedup key, in key layout 4's
-- shapes or in any mix of layout 5's changes (docs/layout-5-plan.md on branch layout5-plan,
-- §1), so that layout5.py can measure each change alone and all of them together. ARGV[3] is
-- a list of `name=value` options (defaults are layout 4's):
--   tenants=8           tenants of the one shard `sluice:{s07.19}:` (execution i is tenant i % 8's)
--   state=queued        or `completed` (a retained row, its mapping a string key with the TTL)
--   params=30           the params' length: 30 (the issue's ~30 bytes) or 200
--   id=hex              or `bin`: the execution id as 32 hex digits or its 16 bytes, in every key
--                       and member that holds it (§1.1)
--   dh=hex              or `bin`: the row's dedup digest `dh` as 32 hex digits or 16 bytes
--   fp=0                or `1`: the row also holds `fp`, the request fingerprint's 8 bytes (§1.2)
--   val=hex             or `bin`: the mapping value `<id>:<16 hex fp>` or `<id><8-byte fp>`
--   field=hex           or `bin`: the bucket field, the digest's other 30 hex digits or 15 bytes
--   ddkey=hex           or `bin`: a retained mapping's key `...:dd:<32 hex>` or `...:dd:<16 B>`
--   lchar=q             the listing member's status char (`A` in layout 5: the same length)
--   queue=zset          one zset `<p>t:<t>:waiting`, or `chunk`: chunks `<p>t:<t>:w:<n>` of at
--                       most `chunk` members under the directory `<p>t:<t>:wd` (§1.3)
--   chunk=128
--   parts=row,listing,queue,dedup   which structures to write (one question at a time)
--   only=all            or a list like `1,2,7`: write only these tenants' executions (one
--                       node's share of a cluster whose shards live on several masters)
-- A chunk opens when its tenant's previous one holds `chunk` members (the append path of
-- §1.3: an admission at the default priority, its order key `ready_at`, as order_key() in
-- common.lua answers it); the directory's entry is score the chunk's first order key, member
-- `<its first id><n>`. Only the parts an option names differ between two fills, so the growth
-- of used_memory between two of them is what that option costs or saves.
-- Returns the first and the last row key written (for DEBUG LISTPACK).
local from, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local o = { tenants = '8', state = 'queued', params = '30', id = 'hex', dh = 'hex', fp = '0',
  val = 'hex', field = 'hex', ddkey = 'hex', lchar = 'q', queue = 'zset', chunk = '128',
  parts = 'row,listing,queue,dedup', only = 'all' }
for k, v in string.gmatch(ARGV[3] or '', '([%w_]+)=([^%s]+)') do
  assert(o[k], 'unknown option ' .. k)
  o[k] = v
end
local parts = {}
for part in string.gmatch(o.parts, '[^,]+') do parts[part] = true end
local only = nil
if o.only ~= 'all' then
  only = {}
  for ti in string.gmatch(o.only, '%d+') do only[tonumber(ti)] = true end
end
local tenants, done, chunk = tonumber(o.tenants), o.state == 'completed', tonumber(o.chunk)
local pad = tonumber(o.params) - 16
local p = 'sluice:{s07.19}:'
local base = 1796000000000
local function bytes(hex)
  return (string.gsub(hex, '..', function(h) return string.char(tonumber(h, 16)) end))
end
local first, last
for i = from, from + n - 1 do
  if not only or only[i % tenants] then
    -- A UUIDv7: 48 bits of milliseconds, version 7, variant 10, random bits.
    local ms = base + math.floor(i / 10)
    local b, t = {}, ms
    for k = 6, 1, -1 do b[k] = t % 256; t = math.floor(t / 256) end
    b[7], b[8], b[9] = 0x70 + math.random(0, 15), math.random(0, 255), 0x80 + math.random(0, 63)
    for k = 10, 16 do b[k] = math.random(0, 255) end
    local hex = {}
    for k = 1, 16 do hex[k] = string.format('%02x', b[k]) end
    local id = o.id == 'bin' and string.char(unpack(b)) or table.concat(hex)
    local ti = i % tenants
    local tenant = 'bench' .. ti
    local tp = p .. 't:' .. tenant
    local dh = string.sub(redis.sha1hex('k' .. i), 1, 32)
    -- (pad 14 gives the ~30-byte params of bench/id-bytes/fill.lua, 29 bytes at 5 digits.)
    local params = string.format('{"n":%d,"pad":"%s"}', i, string.rep('x', pad - #tostring(i)))
    local fingerprint = string.sub(redis.sha1hex('f' .. i), 1, 16)
    local mapping = o.val == 'bin' and id .. bytes(fingerprint) or id .. ':' .. fingerprint
    if parts.row then
      local row = { 't', tenant, 'f', 'demo.echo', 'p', params, 'm', '5', 'c', tostring(ms),
        'z', tostring(512 + #params), 'd', 'mem-' .. i, 'dh', o.dh == 'bin' and bytes(dh) or dh }
      if o.fp == '1' then table.insert(row, 'fp'); table.insert(row, bytes(fingerprint)) end
      if done then
        for _, v in ipairs({ 's', 'completed', 'a', '1', 'st', tostring(ms + 3), 'fi',
          tostring(ms + 5), 'u', tostring(ms + 5), 'o', '{"n":' .. i .. '}' }) do
          table.insert(row, v)
        end
      else
        table.insert(row, 's'); table.insert(row, 'queued')
      end
      local key = p .. 'exec:' .. id
      redis.call('HSET', key, unpack(row))
      first = first or key
      last = key
    end
    if parts.listing then
      local char = done and (o.lchar == 'A' and 'C' or 'c') or o.lchar
      redis.call('ZADD', tp .. ':ls', 0, char .. 'demo.echo\0' .. id)
    end
    if parts.queue and not done then
      if o.queue == 'chunk' then
        local seq = math.floor(i / tenants)
        local c = tostring(math.floor(seq / chunk))
        if seq % chunk == 0 then redis.call('ZADD', tp .. ':wd', ms, id .. c) end
        redis.call('ZADD', tp .. ':w:' .. c, ms, id)
      else
        redis.call('ZADD', tp .. ':waiting', ms, id)
      end
    end
    if parts.dedup then
      if done then
        local name = o.ddkey == 'bin' and bytes(dh) or dh
        redis.call('SET', tp .. ':dd:' .. name, mapping, 'EX', 604800)
      else
        local field = o.field == 'bin' and string.sub(bytes(dh), 2) or string.sub(dh, 3)
        redis.call('HSET', tp .. ':ddb:' .. string.sub(dh, 1, 2), field, mapping)
      end
    end
  end
end
return { first or '', last or '' }
