#!lua flags=allow-oom
-- list.lua: one page of a tenant's executions, newest first, optionally filtered by status
-- and/or flow. Cost is proportional to the page: each status index is read from the cursor for
-- at most limit+1 ids (execution ids are time-ordered, so lexical order is age order), the
-- candidates are merged, and only the page's rows are read. The page also ends early once its
-- rows add up to the byte budget (the first row is always included, so every page makes
-- progress): one call never returns more than the budget plus one row.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2..] indexes: KEYS[2..n+1] the tenant's status index of each of the n statuses listed
--          (the one of the filter, or all five in the order queued, running, completed,
--          failed, cancelled; the filter 'scheduled' reads the index of scheduled executions,
--          queued ones on the timer set, see schedule() in common.lua); then, with a flow
--          filter, KEYS[n+2..2n+1] the flow's index of each of those statuses, same order;
--          last, with a dedup key filter, the tenant's bucket of live dedup mappings that
--          holds that key's, then the key's terminal mapping (see dedup_holder() in
--          common.lua)
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  status: the status filter, '' for all, 'scheduled' for the queued executions not
--          yet due
-- ARGV[8]  flow: the flow filter, '' for all
-- ARGV[9]  cursor: the last id of the previous page, '' for the first page
-- ARGV[10] limit: 1..200
-- ARGV[11] budget: the page ends before the row that would take its rows' field names and
--          values past this many bytes
-- ARGV[12] dedup: the dedup key filter, '' for none: only the execution the tenant's mapping
--          of this key names (at most one), if its row still carries the key
-- ARGV[13] dedup_digest: with a dedup key filter, the key's digest (names the mapping, see
--          admit.lua)
-- ARGV[14] from: lower id bound, inclusive, '' for none: the 12 hex digits of a millisecond
--          time (an execution id starts with its admission time in ms, so lexical order is age)
-- ARGV[15] before: upper id bound, exclusive, '' for none: the same for the end of the range
--
-- Reply: {next_cursor or '', total, id, row, id, row, ...}; next_cursor is set whenever more
-- may follow (also after a page cut short by the budget). `total` counts the executions that
-- match every filter (ZLEXCOUNT over the time range: O(log n) per index). Index entries whose
-- row has expired are removed on the way (the sweeper does the same in bulk).
local tenant, status, flow, cursor = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local limit = tonumber(ARGV[10])
local budget = tonumber(ARGV[11])
local dedup, lower, upper = ARGV[12], ARGV[14], ARGV[15]

local statuses = STATUSES
if status ~= '' then statuses = { status } end
local status_idx, flow_idx = {}, {}
for i, s in ipairs(statuses) do
  status_idx[s] = declared(1 + i, K.status_idx(tenant, s))
  if flow ~= '' then flow_idx[s] = declared(1 + #statuses + i, K.flow_idx(tenant, flow, s)) end
end
local bucket, mapping = nil, nil
if dedup ~= '' then
  bucket = declared(#KEYS - 1, K.dedup_bucket(tenant, ARGV[13]))
  mapping = declared(#KEYS, K.dedup(tenant, ARGV[13]))
end
-- The range every index is read in: the time bounds, and below the cursor.
local min, top = '-', '+'
if lower ~= '' then min = '[' .. lower end
if upper ~= '' then top = '(' .. upper end
local max = top
if cursor ~= '' and (upper == '' or cursor < upper) then max = '(' .. cursor end

local candidates, source, total = {}, {}, 0
if dedup ~= '' then
  -- At most one execution holds a dedup key: read it from the mapping, then check that it
  -- passes the other filters (its status and flow by index membership, its age by its id).
  local mapped = redis.call('HGET', bucket, dedup_field(ARGV[13]))
    or redis.call('GET', mapping)
  local id = mapped and string.match(mapped, '^([0-9a-f]+):')
  if id and redis.call('HGET', K.row(id), 'd') == dedup
    and (lower == '' or id >= lower) and (upper == '' or id < upper) then
    for _, s in ipairs(statuses) do
      local idx = status_idx[s]
      if flow ~= '' then idx = flow_idx[s] end
      if redis.call('ZSCORE', idx, id) then
        total = 1
        if cursor == '' or id < cursor then
          table.insert(candidates, id)
          source[id] = s
        end
        break
      end
    end
  end
else
  for _, s in ipairs(statuses) do
    local idx = status_idx[s]
    if flow ~= '' then idx = flow_idx[s] end
    if min == '-' and top == '+' then
      total = total + redis.call('ZCARD', idx)
    else
      total = total + redis.call('ZLEXCOUNT', idx, min, top)
    end
    local ids = redis.call('ZRANGE', idx, max, min, 'BYLEX', 'REV', 'LIMIT', 0, limit + 1)
    for _, id in ipairs(ids) do
      table.insert(candidates, id)
      source[id] = s
    end
  end
end
table.sort(candidates, function(a, b) return a > b end)

local next_cursor = ''
local reply = { '', 0 }
local used = 0
for i = 1, math.min(limit, #candidates) do
  local id = candidates[i]
  local row, gone = view(id), false
  if source[id] == 'scheduled' and #row > 0
    and redis.call('HGET', K.row(id), 'q') ~= 'scheduled' then
    -- Became runnable or ended without leaving the index (repair): not listed.
    redis.call('ZREM', status_idx.scheduled, id)
    if flow ~= '' then redis.call('ZREM', flow_idx.scheduled, id) end
    row, gone = {}, true
  end
  local size = #id
  for j = 1, #row do size = size + #row[j] end
  if used > 0 and used + size > budget then
    -- Over the budget: this row starts the next page.
    next_cursor = candidates[i - 1]
    break
  end
  used = used + size
  if gone then
    total = total - 1
  elseif #row == 0 then
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
