#!lua
-- admit.lua: admit executions, each atomically: dedup claim, row, indexes, quota decision,
-- enqueue. One call carries one admission or a group of them, in arrival order (group
-- commit, see src/store/commit.rs): each is decided exactly as if it had come alone, after
-- those before it (a dedup key repeated in the group is a replay of the first).
--
-- begin_call: itself
-- (The composer adds no begin_call() before the first line: admit_one() runs it past the
-- dedup lookup, see BEGUN below. compose::BEGINS_ITSELF reads the line above.)
--
-- KEYS[1]  frozen: the shard's freeze marker (see guard.lua)
-- KEYS[2..] admissions: for each admission in order, 1 key, and a 2nd and 3rd with a dedup
-- key:
--   +0 listing: the tenant's listing (K.listing() in common.lua)
--   +1 dedup_bucket: the tenant's bucket of live dedup mappings that holds the key's
--      (K.dedup_bucket() in common.lua; only with a dedup key)
--   +2 dedup: the dedup mapping's string key, where it is once its execution ended (only
--      with a dedup key)
-- Declared: what a replay reads (the dedup keys, named from the request) and what every new
-- admission writes by name (its listing). Every other key is built inside from the prefix
-- the guard checked, by the code that touches it, as the helpers of common.lua always did:
-- the new row and its void marker (K.row(id), K.void(id): a replay touches neither), the
-- tenant's cfg, queue, slots and flows, the shard's tenants, runnable and timer sets, the
-- trends counters and the busy set (names Redis's clock picks), with a concurrency key the
-- key's queue and the tenant's blocked keys, and the tenant's expiry buckets. Each declared
-- key costs every call the guard's check (about 400 instructions; a key new on every call,
-- such as a row, a string search of about 1,200: callgrind on Redis 7.0), where a key built
-- inside costs a concatenation only on the path that uses it.
-- ARGV[1..5] common: see common.lua
-- ARGV[6]  count: the number of admissions, 1..100
-- ARGV[7]  max_bytes: the server's max_bytes (for tenants without their own, see "Storage")
-- ARGV[8]  max_retained: the server's max_retained (likewise)
-- ARGV[9..] admissions: for each admission in order, 16 values:
--   +0  tenant: tenant id (validated: no braces, colons or spaces)
--   +1  id: new execution id (32 lowercase hex, minted by the caller)
--   +2  flow: flow id (validated key-safe)
--   +3  version: '' for none
--   +4  params: JSON text of an object
--   +5  max_attempts: how many attempts it may have
--   +6  dedup_key: the dedup key as given, '' for none
--   +7  dedup_digest: digest of the dedup key: 128 bits of its SHA-256, hex ('' for none)
--   +8  fingerprint: the request's fingerprint (flow, version, params), hex; its 8 bytes
--       at layout 5 (Shard::stored_fingerprint)
--   +9  priority: 1..5 (1 first)
--   +10 start_at: when to start at the earliest: '@<Unix ms>' (run_at), '+<ms>' after the
--       admission (delay), '' for now (one value, not two: each value is an element of
--       Redis's ARGV table, about 800 instructions, and most admissions give neither)
--   +11 ckey: the concurrency key as given, '' for none
--   +12 ckey_digest: digest of the concurrency key (as the dedup key's), '' for none
--   +13 traceparent: W3C traceparent, '' for none (validated by the caller)
--   +14 tracestate: W3C tracestate, '' for none
--   +15 dedup_field: the mapping's field in its bucket, `keys::dedup_field` of the digest
--       ('' for none): computed once, in Rust, so that a replay cuts no string (a test pins
--       it to dedup_field() in common.lua for many digests)
--
-- Reply: one entry per admission, in order, each one of:
--   {'new', qstate, now, due, tpos, kpos, klimit}
--                       admitted at `now` (ms), queue state 'scheduled', 'ready' or
--                       'waiting' (see queue_state() in common.lua), due time in ms or ''
--                       when not scheduled; when runnable, its position (position() in
--                       common.lua; '' where none); the caller knows the rest of the row.
--                       A runnable one's reply is instead the one string
--                       'new:<qstate>:<now>::<tpos>:<kpos>:<klimit>' (the same values joined
--                       by ':', which none of them holds; Redis turns a Lua table of a reply
--                       and each of its values into its answer at a cost of about 4,700
--                       instructions more than one string: `call` in src/store/commit.rs
--                       splits it back into the list); alone in its call, that string is the
--                       whole reply (no table of one entry around it: `short_reply` in
--                       src/store/commit.rs tells it from a replay's id by its 'new:')
--   {'dup', id}         the dedup key maps to execution id, admitted with the same request;
--                       nothing written; alone in its call, the whole reply is the string
--                       <id> instead (Redis turns each Lua table of a reply into its answer
--                       at a cost of thousands of instructions, a string at a fraction, and
--                       the id is a string the call has made already where 'dup:<id>' was one
--                       more: `short_reply` in src/store/commit.rs reads it back as
--                       {'dup', id}).
--                       The caller reads the execution itself (one pipeline
--                       of plain commands, as GET does: `Store::replayed` in
--                       src/store/admit.rs): a reply element costs Redis about a thousand
--                       instructions when Lua builds it, and the whole row was ~34 of them,
--                       most of a replay's cost (bench/README.md, "Per-call overhead, round
--                       two"). The row may change or go between the two; the caller answers
--                       what it reads, and admits again (bounded) when the row is gone.
--   {'conflict', id}    the dedup key maps to id, admitted with a different request
--   {'void'}            this id was declared abandoned (abandon.lua ran first); nothing written
--   {'disabled'}        the tenant is disabled; nothing written
--   {'deleting'}        the tenant is being deleted (tenant_drop.lua); nothing written
--   {'full', queued}    the tenant has max_queued executions queued; nothing written
--   {'too_large', size, max_bytes}
--                       the execution's logical size (see "Storage" in common.lua) is over
--                       the tenant's max_bytes: it can never fit; nothing written
--   {'storage_full', bound, count, limit, wait_ms}
--                       the tenant keeps `limit` logical bytes ('bytes', with this one) or
--                       retained rows ('retained'); its next expiry bucket drains in
--                       wait_ms (-1: none); nothing written
--   {'moved', n}        the tenant is pinned to dedicated shard n (pin.lua; the quota decision
--                       of place() finds it): nothing written
--   {'error', message}  this admission raised an error (a bug, or data sluice did not write);
--                       what it wrote before the error stays, as with any script, and the
--                       admissions after it are still decided
-- The hot path: unlike the other scripts, admit does not rebuild each declared key to check
-- its position (that cost ~7 % of an admission). guard.lua has checked that every key is in
-- this shard; the one caller (`Store::admit`) lists them in this order, and the test
-- `fences::admit_declares_the_keys_it_writes` checks that list against what the script writes.
-- The row is written by make_runnable() or schedule() (common.lua) under K.row(id).
--
-- What an admission does not ask Redis, because a value it reads anyway answers (each a
-- command of about 5,000 instructions, on every fresh admission):
--   the void marker's EXISTS: abandon.lua writes, beside the marker, the time its last marker
--     expires into the tenant's cfg (`void_until`, read with the limits); the marker is looked
--     for only before that time. A replay writes nothing, so it is answered before.
--   the registries' SADDs: the cfg field `reg_flow` names the flow this tenant last admitted,
--     and is written (flush_usage(), in the HSET of the counters) only by a call that added
--     the tenant and that flow to the registries. So `reg_flow` present means the tenant is
--     in K.tenants(), and `reg_flow` == flow means the flow is in K.flows(t): both are then
--     members already. Registry members leave only in tenant_reap.lua, which deletes the
--     field first (the sweeper only adds); a cfg deleted or rebuilt without it costs the
--     SADDs once more. Checked by `implications::` in tests/api.
-- What the admissions of a call share, and admit_one(), are made once, when the library loads
-- (src/store/compose.rs, split_once); each call sets them afresh below "Per call".
local TENANTS

-- What this call learnt of each tenant, so that its later admissions in the call skip the
-- reads (about a third of an admission's Redis calls; only this call's own admissions change
-- these, and it keeps them up to date): its queued count (nil once a write of it failed),
-- true when it is in the runnable set (more work never takes it out), the slots it holds (an
-- admission takes none), and the registry members and busy marks written already.
-- And the admissions counted per tenant (TALLIED, its tenants in first-counted order in
-- TALLY_ORDER): written to the per-minute counters once per tenant at the end of the call
-- (one tally() of n, the same counters as n tallies of one: every admission of a call has
-- the call's time), as a tally() per admission cost 12,500 instructions of a batch item's
-- 166,000 (callgrind on Redis 7.0, bench/README.md "Round seven").
-- Made by the first admission that gets past the dedup check, and only in a call of more than
-- one admission (MANY): a replayed admission, the commonest repeat, and a call of one, the
-- commonest call at a low rate, need none (five tables, about a thousand instructions each
-- with their collection, and the registries' keys joined into strings; callgrind on Redis
-- 7.0).
local QUEUED, RUNNABLE, HELD, LISTED, BUSY, TALLIED, TALLY_ORDER
local MANY
-- The server's storage bounds (ARGV[7], ARGV[8]), for tenants without their own.
local MAX_BYTES, MAX_RETAINED
-- The admission counts (ARGV[6]) met so far, text to number: a count seen before is a table
-- read instead of tonumber() (a C function call, about a thousand instructions). Only valid
-- counts (1..100) are kept, so it holds at most 100 entries.
local COUNTS = {}
-- Whether this call has run begin_call() (common.lua), which sets the helpers' per-call state
-- afresh. The composer does not call it for admit.lua (its header declares that its code calls
-- it, compose::BEGINS_ITSELF): a call of one runs it in admit_one(), after the dedup lookup, so a
-- replay, which reads none of that state, is answered without it (about 2,400 instructions of a
-- replay's 21,000; callgrind on Redis 7.0, bench/README.md "Round five: admission").
local BEGUN

-- One admission: its keys from KEYS[k], its values from ARGV[a].
local function admit_one(k, a)
  -- A replay is answered before the rest of the admission's values are read. It writes
  -- nothing, so it needs no void check: an abandoned admission (abandon.lua) whose key maps to
  -- an execution admitted since stays unadmitted either way.
  local dedup, dedup_hash, fingerprint = ARGV[a + 6], ARGV[a + 7], ARGV[a + 8]
  local bucket, stale = nil, nil
  if dedup ~= '' then
    bucket = KEYS[k + 1]
    local holder, holder_fp
    holder, holder_fp, stale = dedup_holder(bucket, KEYS[k + 2], ARGV[a + 15], fingerprint)
    if holder then
      if holder_fp ~= fingerprint then return { 'conflict', holder } end
      -- Two values, not a table: the call makes the table only when it answers one.
      return 'dup', holder
    end
  end
  if not BEGUN then
    begin_call()
    BEGUN = true
  end

  local tenant, id, flow, version, params = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4]
  local max_attempts = ARGV[a + 5]
  -- The schedule's parts only of one given (most are ''): C function calls each.
  local priority, start_at = ARGV[a + 9], ARGV[a + 10]
  local run_at, delay = nil, nil
  if start_at ~= '' then
    local ms = tonumber(string.sub(start_at, 2))
    if string.sub(start_at, 1, 1) == '@' then run_at = ms else delay = ms end
  end
  local ckey, ckh = ARGV[a + 11], ARGV[a + 12]
  local traceparent, tracestate = ARGV[a + 13], ARGV[a + 14]
  local LISTING = KEYS[k]
  if MANY and not QUEUED then
    QUEUED, RUNNABLE, HELD, LISTED, BUSY, TALLIED, TALLY_ORDER = {}, {}, {}, {}, {}, {}, {}
  end

  local now = now_ms()
  local ok, refusal, queued = place(tenant, MANY and QUEUED[tenant], LISTING)
  if not ok then
    if MANY and refusal == 'full' then QUEUED[tenant] = queued end
    return { refusal, queued }
  end
  -- The caller gave up on this admission and was told nothing happened: keep it that way. Its
  -- marker can exist only until the tenant's `void_until` (see above; a second of margin for
  -- the time Redis took the call's expiry checks at).
  local cfg = LIMITS_READ[tenant]
  local void_until = cfg[16]
  if void_until and now <= void_until + 1000 and redis_call('EXISTS', K.void(id)) == 1 then
    return { 'void' }
  end
  local size = ROW_BYTES + #params
  local full = storage_refusal(tenant, size, 0, now, MAX_BYTES, MAX_RETAINED, true)
  if full then return full end
  local due = run_at or (delay and now + delay)
  if due and due <= now then due = nil end

  -- Decided; from here on only writes.
  -- A new row leaves out what equals its default (see "Rows" in common.lua): attempt 0,
  -- `u` (updated) equal to `c` (created), the default priority, and (make_runnable()) its
  -- queue state `queued` and ready_at equal to `c`.
  -- Appended by index (n: the row's length so far), not by table.insert() or ipairs() of a
  -- table made for it: C function calls and a table each (about a thousand instructions
  -- apiece, callgrind on Redis 7.0).
  -- Its time as text, made once per call (now_text() in common.lua, the same text as
  -- tostring(now), which cost 3,800 instructions of a batch item: bench/README.md "Round
  -- seven"): Redis formats every number handed to redis.call() with sprintf (about 3,500
  -- instructions for a time in ms, callgrind on Redis 7.0), and the row's `c` and, at the
  -- default priority, its order key in the tenant's queue are the same time.
  local now_str = now_text()
  -- Made with room for four more (the nils: the constructor sizes the table's array part for
  -- 18), so that a dedup key's two fields, the commonest addition, are appended without the
  -- table growing (a rehash: 3,000 instructions of a batch item, bench/README.md "Round
  -- seven"). unpack() and # still end at the last field written: the array is filled from 1
  -- with no gap.
  local row = { 't', tenant, 'f', flow, 'p', params, 's', 'queued', 'm', max_attempts,
    'c', now_str, 'z', num_text(size), nil, nil, nil, nil }
  local n = 14
  if priority ~= DEFAULT_PRIORITY then
    row[n + 1], row[n + 2], n = 'pr', priority, n + 2
  end
  if version ~= '' then row[n + 1], row[n + 2], n = 'v', version, n + 2 end
  if dedup ~= '' then
    row[n + 1], row[n + 2], row[n + 3], row[n + 4], n = 'd', dedup, 'dh', dedup_hash, n + 4
    -- Layout 5 (a binary digest): the fingerprint too, so that the completion moves the
    -- mapping without reading it (dedup_end() in common.lua).
    if #dedup_hash == 16 then row[n + 1], row[n + 2], n = 'fp', fingerprint, n + 2 end
  end
  if ckh ~= '' then
    row[n + 1], row[n + 2], row[n + 3], row[n + 4], n = 'k', ckey, 'kh', ckh, n + 4
  else
    ckh = nil
  end
  if traceparent ~= '' then
    row[n + 1], row[n + 2], n = 'tp', traceparent, n + 2
    if tracestate ~= '' then row[n + 1], row[n + 2], n = 'ts', tracestate, n + 2 end
  end
  local listed = redis_call('ZADD', LISTING, '0', listing_member('queued', flow, id)) == 1
  if MANY then QUEUED[tenant] = listed and queued + 1 or nil end
  -- Registries the sweeper and status-only listings walk (set members): only where the cfg's
  -- `reg_flow` (see above) does not say the members are there, and once per call.
  local reg = cfg[17]
  if reg ~= flow then
    local FLOWS = K.flows(tenant)
    if not TENANTS then TENANTS = K.tenants() end
    if not MANY then
      if not reg then redis_call('SADD', TENANTS, tenant) end
      redis_call('SADD', FLOWS, flow)
    else
      if not reg and not LISTED[TENANTS .. tenant] then
        redis_call('SADD', TENANTS, tenant)
        LISTED[TENANTS .. tenant] = true
      end
      if not LISTED[FLOWS .. flow] then
        redis_call('SADD', FLOWS, flow)
        LISTED[FLOWS .. flow] = true
      end
    end
    -- Both are members now: written with the counters at the end of the call.
    register_flow(tenant, flow)
  end
  -- The row is written here, with its queue state, in one HSET: scheduled (`due`, when given,
  -- is later than now) or runnable, with the time as text.
  local runnable, waiting
  if due then
    schedule(tenant, flow, id, due, row)
    runnable = false
  else
    -- Its tenant's order's name, made once for make_runnable() and position() (a string of
    -- four parts each time).
    waiting = K.waiting(tenant)
    runnable = make_runnable(tenant, id, now_str, priority, row, ckh, MANY and RUNNABLE[tenant],
      true, queued == 0, waiting)
  end
  if runnable then
    if MANY then RUNNABLE[tenant] = true end
  elseif not (MANY and BUSY[tenant]) then
    mark_busy(tenant)
    if MANY then BUSY[tenant] = true end
  end
  if MANY then
    local counted = TALLIED[tenant]
    if not counted then TALLY_ORDER[#TALLY_ORDER + 1] = tenant end
    TALLIED[tenant] = (counted or 0) + 1
  else
    tally(tenant, 'admitted', now)
  end
  count_bytes(tenant, size)
  -- A field of its bucket while the execution is live: settle_terminal() moves it to the
  -- string key, with its TTL, when it ends. A leftover string key whose row expired goes.
  if bucket then
    -- (Layout 5's value has no separator: see mapping_id() in common.lua.)
    redis_call('HSET', bucket, ARGV[a + 15],
      #id == 16 and id .. fingerprint or id .. ':' .. fingerprint)
    if stale then redis_call('DEL', KEYS[k + 2]) end
  end
  if due then return { 'new', 'scheduled', now, due } end
  local tpos, kpos, klimit, rank = position(tenant, id, ckh, waiting)
  local held = MANY and HELD[tenant]
  if rank and not held then
    -- refresh() counted them when this admission made its tenant runnable (no slot set
    -- changes in an admission call).
    held = SLOTS_OF == tenant and SLOTS_HELD or redis_call('SCARD', K.slots(tenant))
    if MANY then HELD[tenant] = held end
  end
  -- queue_state() of it, written out: its rank, its tenant's slots held and max_concurrent
  -- are at hand (a call of queue_state() and of limits() for one value cost more).
  local qstate = rank and rank < cfg[18] - held and 'ready' or 'waiting'
  -- One string of the seven values (see the header): a table of them cost Redis 4,700
  -- instructions more per admission of a batch, and serve the parse of seven values. The
  -- fourth value says it is that string: a call of one answers it alone (see the end).
  return 'new:' .. qstate .. ':' .. now_str .. '::' .. (tpos or '') .. ':' .. (kpos or '') ..
    ':' .. (klimit or ''), nil, true
end

-- Per call: the state admit_one() shares within a call, set afresh.
BEGUN = false
TENANTS = nil
QUEUED, RUNNABLE, HELD, LISTED, BUSY, TALLIED, TALLY_ORDER = nil, nil, nil, nil, nil, nil, nil
local n = COUNTS[ARGV[6]]
if not n then
  n = tonumber(ARGV[6])
  if n and n >= 1 and n <= 100 and n % 1 == 0 then COUNTS[ARGV[6]] = n end
end
MAX_BYTES, MAX_RETAINED = ARGV[7], ARGV[8]
-- 16 values an admission (17 before `start_at` took run_at's and delay's place, 16 before
-- the bucket's field came as one): a call of another shape is refused here, never read with
-- its values shifted. (The older shape of 16 cannot reach this code: a build calls only its
-- own library, named by a hash of its text, src/store/scripts.rs.)
if not n or n < 1 or n > 100 or #ARGV ~= 8 + 16 * n then
  return redis.error_reply('ERR sluice admit: ' .. tostring(ARGV[6]) .. ' admissions with ' ..
    #ARGV .. ' values')
end
MANY = n > 1
-- Every admission's keys are where the header says, or nothing is done.
local want = 1
for i = 0, n - 1 do
  want = want + (ARGV[15 + 16 * i] ~= '' and 3 or 1)
end
if want ~= #KEYS then
  return redis.error_reply('ERR sluice admit: ' .. #KEYS .. ' keys for ' .. n ..
    ' admissions, not ' .. want)
end
if n == 1 then
  -- The commonest call, and a replay's: no table of replies before one is answered, and
  -- begin_call() run by admit_one() only past the dedup lookup (see BEGUN). (Answering a
  -- replay here, before the pcall and the call of admit_one(), was tried and measured: no
  -- fewer instructions, bench/README.md "Round four".)
  local ok, reply, dup, joined = pcall(admit_one, 2, 9)
  if dup then return dup end
  if joined then
    -- A new runnable admission: its joined string is the whole reply (no table of one entry).
    flush_trends()
    flush_usage()
    return reply
  end
  if not ok then
    reply = { 'error', type(reply) == 'table' and tostring(reply.err) or tostring(reply) }
    -- Failed in the dedup lookup: the flushes below must not find the last call's state.
    if not BEGUN then begin_call() end
  end
  flush_trends()
  flush_usage()
  return { reply }
end
begin_call()
BEGUN = true
local replies, k, a = {}, 2, 9
for i = 1, n do
  local ok, reply, dup = pcall(admit_one, k, a)
  if dup then
    replies[i] = { reply, dup }
  elseif ok then
    replies[i] = reply
  else
    replies[i] = { 'error', type(reply) == 'table' and tostring(reply.err) or tostring(reply) }
  end
  k = k + (ARGV[a + 6] ~= '' and 3 or 1)
  a = a + 16
end
-- The per-minute counters of every admission of the call (counted per tenant, see TALLIED),
-- and its tenants' storage counters, in one write per key.
if TALLY_ORDER then
  for i = 1, #TALLY_ORDER do
    local t = TALLY_ORDER[i]
    tally(t, 'admitted', now_ms(), TALLIED[t])
  end
end
flush_trends()
flush_usage()
return replies
