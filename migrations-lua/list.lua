#!lua flags=allow-oom
-- list.lua: one page of a tenant's executions, newest first, optionally filtered by status
-- and/or flow. Cost is proportional to the page: each status index is read from the cursor for
-- at most limit+1 ids (execution ids are time-ordered, so lexical order is age order), the
-- candidates are merged, and only the page's rows are read. The page also ends early once its
-- rows add up to the byte budget (the first row is always included, so every page makes
-- progress): one call never returns more than the budget plus one row.
--
-- KEYS[1]  the shard's freeze marker (see guard.lua)
-- KEYS[2..n+1]    the tenant's status index of each of the n statuses listed (the one of the
--                 filter, or all five in the order queued, running, completed, failed,
--                 cancelled)
-- KEYS[n+2..2n+1] with a flow filter: the flow's index of each of those statuses, same order
-- ARGV[1..5] common (see common.lua)
-- ARGV[6]  tenant id
-- ARGV[7]  status filter, '' for all
-- ARGV[8]  flow filter, '' for all
-- ARGV[9]  cursor: the last id of the previous page, '' for the first page
-- ARGV[10]  limit (1..200)
-- ARGV[11]  byte budget: the page ends before the row that would take its rows' field names
--           and values past this many bytes
--
-- Reply: {next_cursor or '', total, id, row, id, row, ...}; next_cursor is set whenever more
-- may follow (also after a page cut short by the budget). Index entries whose row has expired
-- are removed on the way (the sweeper does the same in bulk).
local tenant, status, flow, cursor = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local limit = tonumber(ARGV[10])
local budget = tonumber(ARGV[11])

local statuses = STATUSES
if status ~= '' then statuses = { status } end
local status_idx, flow_idx = {}, {}
for i, s in ipairs(statuses) do
  status_idx[s] = declared(1 + i, K.status_idx(tenant, s))
  if flow ~= '' then flow_idx[s] = declared(1 + #statuses + i, K.flow_idx(tenant, flow, s)) end
end
local max = '+'
if cursor ~= '' then max = '(' .. cursor end

local candidates, source, total = {}, {}, 0
for _, s in ipairs(statuses) do
  local idx = status_idx[s]
  if flow ~= '' then idx = flow_idx[s] end
  total = total + redis.call('ZCARD', idx)
  local ids = redis.call('ZRANGE', idx, max, '-', 'BYLEX', 'REV', 'LIMIT', 0, limit + 1)
  for _, id in ipairs(ids) do
    table.insert(candidates, id)
    source[id] = s
  end
end
table.sort(candidates, function(a, b) return a > b end)

local next_cursor = ''
local reply = { '', 0 }
local used = 0
for i = 1, math.min(limit, #candidates) do
  local id = candidates[i]
  local row = hgetall(id)
  local size = #id
  for j = 1, #row do size = size + #row[j] end
  if used > 0 and used + size > budget then
    -- Over the budget: this row starts the next page.
    next_cursor = candidates[i - 1]
    break
  end
  used = used + size
  if #row == 0 then
    -- The row expired; its flow is unknown now unless filtered on, so the sweeper cleans the
    -- flow index otherwise.
    redis.call('ZREM', status_idx[source[id]], id)
    if flow ~= '' then redis.call('ZREM', flow_idx[source[id]], id) end
    total = total - 1
  else
    table.insert(reply, id)
    table.insert(reply, row)
  end
  if i == limit and #candidates > limit then next_cursor = id end
end
reply[1] = next_cursor
reply[2] = total
return reply
