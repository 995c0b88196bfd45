#!lua flags=allow-oom
-- list.lua: one page of a tenant's executions, newest first, optionally filtered by status
-- and/or flow. The tenant's listing (layout 4) holds one lexical range per status and flow,
-- ordered by id (ids are time-ordered, so lexical order is age order): a page reads the
-- ranges the filter names — one for status and flow, five (one per status) for a flow, one
-- per flow of the tenant for a status, five per flow unfiltered — from the cursor, merges
-- them, and reads only the page's rows. The ranges are read in rounds: first a share of the
-- page each (at least 2 ids), then, only while some range may still hold a row of the page,
-- those ranges again, each read twice as far as before; so a range is read at most
-- 1 + log2(limit + 1) times and a page reads about limit + 1 ids when the flows are
-- balanced. The page also ends early once its rows add up to the byte budget (the first row
-- is always included, so every page makes progress): one call never returns more than the
-- budget plus one row.
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2]  listing: the tenant's listing (K.listing(), see "Listing" in common.lua)
-- KEYS[3]  flows: the tenant's set of flows (read without a flow filter: each flow's members
--          of a status are a range of their own)
-- KEYS[4..] mapping: with a dedup key filter, the tenant's bucket of live dedup mappings that
--          holds that key's, then the key's terminal mapping (see dedup_holder() in
--          common.lua); none without
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  tenant: tenant id
-- ARGV[7]  status: the status filter, '' for all, 'scheduled' for the queued executions not
--          yet due
-- ARGV[8]  flow: the flow filter, '' for all
-- ARGV[9]  cursor: the last id of the previous page (stored form), '' for the first page
-- ARGV[10] limit: 1..200
-- ARGV[11] budget: the page ends before the row that would take its rows' field names and
--          values past this many bytes
-- ARGV[12] dedup: the dedup key filter, '' for none: only the execution the tenant's mapping
--          of this key names (at most one), if its row still carries the key
-- ARGV[13] dedup_digest: with a dedup key filter, the key's digest (names the mapping, see
--          admit.lua)
-- ARGV[14] from: lower id bound, inclusive, '' for none: a millisecond time as the ids'
--          stored form begins (an execution id starts with its admission time in ms, so
--          lexical order is age): 12 hex digits, or 6 bytes where ids are binary (layout 5)
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

-- Ids are compared in Lua by their hex (public_id() in common.lua; a hex id is its own): Lua
-- compares strings with strcoll, whose order for bytes that are not text (a binary id's)
-- depends on the locale Redis runs in. The sorted sets' own order is bytewise, the hex's is
-- the same. The bounds likewise (6 bytes of a binary id's time, or 12 hex digits).
local HEX6 = '%02x%02x%02x%02x%02x%02x'
local function bound_hex(b)
  if #b == 6 then return string.format(HEX6, string.byte(b, 1, 6)) end
  return b
end
local lower_hex, upper_hex = bound_hex(lower), bound_hex(upper)
local cursor_hex = public_id(cursor)

local statuses = STATUSES
if status ~= '' then statuses = { status } end
local LISTING = declared(2, K.listing(tenant))
local FLOWS = declared(3, K.flows(tenant))
local bucket, mapping = nil, nil
if dedup ~= '' then
  bucket = declared(4, K.dedup_bucket(tenant, ARGV[13]))
  mapping = declared(5, K.dedup(tenant, ARGV[13]))
end
local flows = { flow }
if flow == '' and dedup == '' then flows = redis_call('SMEMBERS', FLOWS) end

-- order[id]: the candidate's hex, its sort key.
local candidates, source, order, total = {}, {}, {}, 0
if dedup ~= '' then
  -- At most one execution holds a dedup key: read it from the mapping, then check that it
  -- passes the other filters (its status and flow by its listing member, its age by its id).
  local mapped = redis_call('HGET', bucket, dedup_field(ARGV[13]))
    or redis_call('GET', mapping)
  local id = mapped and mapping_id(mapped)
  local row = id and redis_call('HMGET', K.row(id), 'd', 'f') or {}
  local hex = id and public_id(id)
  if id and row[1] == dedup and (flow == '' or row[2] == flow)
    and (lower == '' or hex >= lower_hex) and (upper == '' or hex < upper_hex) then
    for _, s in ipairs(statuses) do
      if redis_call('ZSCORE', LISTING, listing_member(s, row[2], id)) then
        total = 1
        if cursor == '' or hex < cursor_hex then
          table.insert(candidates, id)
          order[id] = hex
          source[id] = { s = s, f = row[2] }
        end
        break
      end
    end
  end
else
  -- Every (status, flow) range the filter names, within the time bounds and below the cursor.
  local ranges = {}
  for _, s in ipairs(statuses) do
    for _, f in ipairs(flows) do
      local min, max = listing_range(s, f)
      local prefix = string.sub(min, 2)
      if lower ~= '' then min = '[' .. prefix .. lower end
      if upper ~= '' then max = '(' .. prefix .. upper end
      table.insert(ranges, { s = s, f = f, prefix = prefix, min = min, max = max })
    end
  end
  -- Totals: one ZLEXCOUNT per status over all its flows when nothing narrows the range,
  -- else one per range (O(log n) each).
  if flow == '' and lower == '' and upper == '' then
    for _, s in ipairs(statuses) do total = total + listing_count(tenant, s) end
  else
    for _, r in ipairs(ranges) do
      total = total + redis_call('ZLEXCOUNT', LISTING, r.min, r.max)
    end
  end
  local want = limit + 1
  local first = want
  if #ranges > 1 then first = math.floor(2 * want / #ranges) + 2 end
  for _, r in ipairs(ranges) do
    r.top, r.take = r.max, first
    if cursor ~= '' and (upper == '' or cursor_hex < upper_hex) then
      r.top = '(' .. r.prefix .. cursor
    end
  end
  -- Rounds: the ids at or above `safe` (the highest last id of a range not read to its end)
  -- are all read; the page is known once `want` of them are.
  for _ = 1, 64 do
    local safe = nil
    for _, r in ipairs(ranges) do
      if not r.done then
        local got = redis_call('ZRANGE', LISTING, r.top, r.min, 'BYLEX', 'REV', 'LIMIT', 0,
          r.take)
        local cut = #r.prefix + 1
        for _, m in ipairs(got) do
          local id = string.sub(m, cut)
          table.insert(candidates, id)
          source[id] = r
          order[id] = public_id(id)
        end
        if #got < r.take then
          r.done = true
        else
          r.top, r.last, r.take = '(' .. got[#got], string.sub(got[#got], cut), r.take * 2
        end
      end
      if not r.done and (not safe or order[r.last] > safe) then safe = order[r.last] end
    end
    if not safe then break end
    local known = 0
    for _, id in ipairs(candidates) do
      if order[id] >= safe then known = known + 1 end
    end
    if known >= want then break end
  end
end
table.sort(candidates, function(a, b) return order[a] > order[b] end)

local next_cursor = ''
local reply = { '', 0 }
local used = 0
for i = 1, math.min(limit, #candidates) do
  local id = candidates[i]
  local src = source[id]
  local row, gone = view(id), false
  if src.s == 'scheduled' and #row > 0
    and redis_call('HGET', K.row(id), 'q') ~= 'scheduled' then
    -- Became runnable or ended without leaving the listing (repair): not listed.
    index_remove(tenant, src.f, 'scheduled', id)
    row, gone = {}, true
  end
  -- (The id as the API answers it: its 32 hex digits, whatever its stored form.)
  local size = 32
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
    -- The row expired: its member goes (the sweeper does the same in bulk).
    index_remove(tenant, src.f, src.s, id)
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
