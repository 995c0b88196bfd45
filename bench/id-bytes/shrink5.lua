-- Leaves at most ARGV[2] members in every chunk `<p>t:<t>:w:<n>` of tenants bench0 ..
-- bench<ARGV[1] - 1> (fill5.lua's queue=chunk), popping the rest one at a time from the
-- chunk's end (ZPOPMAX: the same listpack deletes as a start's ZPOPMIN or a cancel's ZREM,
-- each reallocating the chunk to its new length). The directory is left as it is: a chunk's
-- bound stays valid after pops (docs/layout-5-plan.md §1.3). Returns the members left.
-- ARGV[1] 'warm' instead pops a scratch zset of its own empty: the first pops of a server's
-- life leave about 25 KB of its own allocations in used_memory, which layout5.py lets happen
-- before its first read.
if ARGV[1] == 'warm' then
  for i = 1, 200 do redis.call('ZADD', 'scratch', i, 'm' .. i) end
  for _ = 1, 200 do redis.call('ZPOPMAX', 'scratch') end
  return 0
end
local tenants, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local left = 0
for ti = 0, tenants - 1 do
  local c = 0
  while true do
    local key = 'sluice:{s07.19}:t:bench' .. ti .. ':w:' .. c
    local size = redis.call('ZCARD', key)
    if size == 0 then break end
    for _ = 1, size - keep do redis.call('ZPOPMAX', key) end
    left = left + math.min(size, keep)
    c = c + 1
  end
end
return left
