-- common.lua: helpers of every shard script (composed after guard.lua, which has already
-- checked ARGV[1] and KEYS against each other and refused while the shard is frozen). Not an
-- operation on its own.
--
-- Calling convention shared by every shard script (see guard.lua for KEYS[1] and ARGV[1]):
--   ARGV[1]  the shard prefix, e.g. "sluice:{s07.19}:"
--   ARGV[2]  server default max_concurrent (used when the tenant has no own value)
--   ARGV[3]  server default max_queued
--   ARGV[4]  retention of terminal rows, seconds
--   ARGV[5]  how long a dedup key keeps mapping to its execution once that is terminal, seconds
--   ARGV[6..] operation-specific, documented in each file.
--   KEYS[1]  the shard's freeze marker; KEYS[2..] the keys the operation names, each read
--            through declared(i, K.<builder>(...)), which checks it is the name the builders
--            below give: declared and used keys cannot drift apart.
--
-- Key names mirror src/store/keys.rs; change both together (a test runs these builders
-- against the Rust ones).
-- Lua has no rollback: every script decides first and writes after.
--
-- Long on purpose: one library, in marked sections (key builders and the quota decision, then
-- Rate limits, Dispatch, Dead letters, Webhooks, Waiters, Trends). src/store/compose.rs gives each script
-- only the definitions it reaches, so its length costs no script anything, and the sections
-- call each other (a start throttles, dispatches, tells waiters and counts trends in one step).

-- ARGV[2..5], read by begin_call() at the start of every call (see the end of this file).
local DEFAULT_MAX_CONCURRENT, DEFAULT_MAX_QUEUED, RETENTION_SECS, DEDUP_TTL_SECS
-- Their text as given (see begin_call()).
local POLICY_2, POLICY_3, POLICY_4, POLICY_5

local K = {}
function K.ready() return P .. 'ready' end
function K.runnable() return P .. 'runnable' end
function K.sched() return P .. 'sched' end
function K.starts() return P .. 'starts' end
function K.held(consumer) return P .. 'held:' .. consumer end
function K.row(id) return P .. 'exec:' .. id end
function K.cfg(t) return P .. 't:' .. t .. ':cfg' end
function K.slots(t) return P .. 't:' .. t .. ':slots' end
function K.waiting(t) return P .. 't:' .. t .. ':waiting' end
function K.deleting(t) return P .. 't:' .. t .. ':deleting' end
function K.listing(t) return P .. 't:' .. t .. ':ls' end
function K.dedup(t, h) return P .. 't:' .. t .. ':dd:' .. h end
function K.dedup_bucket(t, h) return P .. 't:' .. t .. ':ddb:' .. string.sub(h, 1, 2) end
function K.flows(t) return P .. 't:' .. t .. ':flows' end
function K.tenants() return P .. 'tenants' end
function K.leases() return P .. 'leases' end
function K.delayed() return P .. 'delayed' end
function K.dlq() return P .. 'dlq' end
function K.tenant_dlq(t) return P .. 't:' .. t .. ':dlq' end
function K.dlq_indexed() return P .. 'dlq_indexed' end
function K.dlq_holders() return P .. 'dlq_holders' end
function K.dlq_poison() return P .. 'dlq_poison' end
function K.dlq_rebuilt() return P .. 'dlq_rebuilt' end
function K.dlq_evicted() return P .. 'dlq_evicted' end
function K.stats() return P .. 'stats' end
function K.void(id) return P .. 'void:' .. id end
function K.frozen() return P .. 'hold' end
function K.bell() return P .. 'bell' end
function K.adopted(consumer) return P .. 'adopted:' .. consumer end
function K.key_queue(t, h) return P .. 't:' .. t .. ':k:' .. h .. ':q' end
function K.key_running(t, h) return P .. 't:' .. t .. ':k:' .. h .. ':run' end
function K.key_limits(t) return P .. 't:' .. t .. ':klim' end
function K.key_blocked(t) return P .. 't:' .. t .. ':kblk' end
function K.tat(t) return P .. 't:' .. t .. ':tat' end
function K.key_tat(t, h) return P .. 't:' .. t .. ':k:' .. h .. ':tat' end
function K.outbox(t) return P .. 't:' .. t .. ':wh' end
function K.webhooks() return P .. 'webhooks' end
function K.delivery_log(t) return P .. 't:' .. t .. ':whlog' end
function K.delivery_lock(t) return P .. 't:' .. t .. ':whlock' end
function K.batch_lock(t) return P .. 't:' .. t .. ':batch' end
function K.reaping() return P .. 'reaping' end
function K.retained(t) return P .. 't:' .. t .. ':ret' end

-- Execution ids. The store passes every id in its shard's stored form, the scripts keep it
-- as they got it: 32 hex digits up to key layout 4, its 16 bytes at layout 5 (Shard::stored_id
-- in src/store/keys.rs), so one library serves either. A stored id is opaque bytes (a binary
-- one may hold ':', '{', NUL): a value holding one is split by position, never by searching
-- a separator. Its first byte is the top byte of its admission time in ms (0x01 until 2039),
-- below '0' and 'r', so ids and the timer set's 'rt:'/'rk:' wake-ups stay apart (a test in
-- src/domain/ids.rs pins it).
-- The hex of an id, where people or other processes read it (the dead-letter record's
-- execution_id, the webhook outbox's id, the channels): one format of its 16 bytes (two C
-- calls), a hex id as it is.
-- (Written out: the library's locals of Lua's globals are set per call, not at its load.)
local HEX16 = '%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x'
local function public_id(id)
  if #id == 16 then return string.format(HEX16, string.byte(id, 1, 16)) end
  return id
end

-- Rows (layout 3, compact). An execution's row is the hash K.row(id); its field names are
-- short because each is stored once per execution (a row is a listpack whose bytes are
-- mostly names and values). This table is the one declaration of them; src/domain/row.rs
-- holds the same table for the Rust readers, and the test `rows::` checks the two against
-- each other and against what the scripts write and read. Numbers are decimal text.
-- A field equal to its default is not stored; the reader supplies it (marked *). One name a
-- line (the test reads this table).
--   name  meaning
--   t     tenant
--   f     flow id
--   v     flow version (absent: none)
--   p     params (JSON text)
--   s     status: queued | running | completed | failed | cancelled
--   m     max_attempts
--   a     attempt: starts of the current run (*0)
--   c     created, ms
--   u     updated, ms (*equal to c)
--   pr    priority 1..5 (*DEFAULT_PRIORITY)
--   z     logical base size, ROW_BYTES + #params (see "Storage")
--   d     dedup key as given
--   dh    the dedup key's digest: 32 hex digits, its 16 bytes at layout 5 (digest_hex())
--   fp    layout 5: the request's fingerprint, 8 bytes (with a dedup key only; dedup_end())
--   k     concurrency key as given
--   kh    the concurrency key's digest
--   tp    traceparent
--   ts    tracestate
--   q     queue state: queued | scheduled (*queued; kept while it runs, see start_entries())
--   r     ready_at, ms: when it became runnable (*equal to c)
--   ra    run_at, ms: its due time while scheduled
--   e     stream entry (schema 1; migrate_dispatch reads it)
--   lo    lease owner (the worker's consumer name)
--   lu    lease until, ms
--   fe    fence: the token of the current start, never repeats
--   x     cancel requested ('1')
--   dl    force-deleted while running ('1')
--   w     somebody waits on it until, ms (see "Waiters")
--   ws    webhook sequence number (see "Webhooks")
--   st    started, ms
--   fi    finished, ms
--   o     output (JSON text)
--   ek    error kind
--   em    error message
--   rp    fence of the run whose report was taken (complete.lua's repeat check)
-- Replies may append fields no row holds: qs, qpt, qpk, qkl (see view()).
local DEFAULT_PRIORITY = '3'

-- KEYS[i], which the caller must have declared as `expected` (the builders' name for it).
-- Called at the top of a script, before any write.
local function declared(i, expected)
  if KEYS[i] ~= expected then
    error('sluice: KEYS[' .. i .. '] is ' .. tostring(KEYS[i]) .. ', expected ' .. expected)
  end
  return KEYS[i]
end

-- The same for a shard key (a builder without arguments, such as K.runnable) on a hot path:
-- each key found to be builder() is remembered (FENCE_BUILT[key] = builder, a table read
-- instead of a call and a concatenation next time). Sound because guard.lua has checked that
-- every KEYS[i] starts with this call's prefix, and a key starts with one prefix only (its
-- tag ends at the first '}'): a key found to be builder() under one prefix is builder() under
-- every prefix it starts with. Bounded with the guard's memory (FENCE_LIMIT).
local function declared_shard(i, builder)
  local key = KEYS[i]
  if FENCE_BUILT[key] ~= builder then
    declared(i, builder())
    FENCE_BUILT[key] = builder
    FENCE_COUNT = FENCE_COUNT + 1
  end
  return key
end

local STATUSES = { 'queued', 'running', 'completed', 'failed', 'cancelled' }

-- Listing (layout 4). A tenant's executions are listed in one sorted set, K.listing(t), every
-- member scored 0 and named `<status char><flow>\0<id>`: one member per execution (a
-- scheduled one has a second, under 's', for the `queue_state=scheduled` filter). So the
-- members of one status are one lexical range (its count is one ZLEXCOUNT: place() reads the
-- queued count so), those of one status and flow another, ordered by id, which starts with
-- the admission time in ms (time ranges and newest-first pages are BYLEX ranges within it).
-- A flow id never holds a byte below '-' (FlowId::parse), so `\0` ends it unambiguously.
-- src/store/keys.rs (`listing_member`) builds the same names.
local LISTING_CHAR = { queued = 'q', running = 'r', completed = 'c', failed = 'f', cancelled = 'x', scheduled = 's' }

-- The status (or 'scheduled') each member prefix stands for.
local LISTING_STATUS = { q = 'queued', r = 'running', c = 'completed', f = 'failed', x = 'cancelled', s = 'scheduled' }

-- The listing member of execution id of `flow` in `status` (or 'scheduled').
local function listing_member(status, flow, id)
  return LISTING_CHAR[status] .. flow .. '\0' .. id
end

-- listing_range('queued'), as place() uses it on every admission (a test checks the two).
local QUEUED_MIN, QUEUED_MAX = '[q', '(r'

-- A listing member's status (nil for a prefix sluice does not write), flow and id.
local function listing_parse(m)
  local z = string.find(m, '\0', 2, true)
  if not z then return nil end
  return LISTING_STATUS[string.sub(m, 1, 1)], string.sub(m, 2, z - 1), string.sub(m, z + 1)
end

-- The lexical bounds (inclusive min, exclusive max) of the members of `status` in a listing,
-- optionally of one flow: for ZLEXCOUNT and ZRANGE ... BYLEX.
local function listing_range(status, flow)
  local c = LISTING_CHAR[status]
  if flow then return '[' .. c .. flow .. '\0', '(' .. c .. flow .. '\1' end
  return '[' .. c, '(' .. string.char(string.byte(c) + 1)
end

-- How many executions of tenant t are in `status` (or 'scheduled'): O(log n).
local function listing_count(t, status)
  local min, max = listing_range(status)
  return redis_call('ZLEXCOUNT', K.listing(t), min, max)
end

-- Now on Redis's clock (ms), read once per call: every time one call writes or compares (a
-- start, its lease, a rate limit's wake-up, the next due time it answers) is the same instant.
local NOW = nil
-- TIME's answer of this call (its seconds as text), and now as text once now_text() made it.
local NOW_TIME, NOW_TEXT = nil, nil
local function now_ms()
  if not NOW then
    -- Arithmetic converts the strings itself: no tonumber() or math.floor() call (each C
    -- function call costs about a thousand instructions).
    local t = redis_call('TIME')
    local us = t[2] + 0
    NOW = t[1] * 1000 + (us - us % 1000) / 1000
    NOW_TIME = t
  end
  return NOW
end

-- The milliseconds of a second as three digits ('000'..'999'), by their number: a memo,
-- filled as they occur (1 000 short strings at most).
local MS_MEMO = {}

-- Now's milliseconds within its second as three digits.
local function ms_digits()
  local ms = now_ms() % 1000
  local digits = MS_MEMO[ms]
  if not digits then
    digits = (ms < 10 and '00' or ms < 100 and '0' or '') .. ms
    MS_MEMO[ms] = digits
  end
  return digits
end

-- A whole number as text, for redis_call(): Redis formats every number handed to it with
-- snprintf("%.17g"), about 2,400 instructions each (callgrind on Redis 7.0, bench/README.md
-- "Round seven: where the Lua goes"), ten of them in an execution's admission, start and
-- completion. The numbers that recur (a row's size, a start's attempt and fence, a retained
-- bucket's field) are formatted once and then read from a memo (its count in field `n`); it
-- holds NUM_MEMO_LIMIT numbers at most and is replaced when full. `number` must be whole
-- ('%d', as Redis prints it).
local NUM_MEMO, NUM_MEMO_LIMIT = { n = 0 }, 1024
local function num_text(number)
  local text = NUM_MEMO[number]
  if not text then
    local memo = NUM_MEMO
    if memo.n >= NUM_MEMO_LIMIT then
      memo = { n = 0 }
      NUM_MEMO = memo
    end
    text = string.format('%d', number)
    memo[number] = text
    memo.n = memo.n + 1
  end
  return text
end

-- A number's text (or a number) as a number, as tonumber() reads it, for texts that recur on
-- every call (the storage bounds in force: the server's, an argument of each admission, and
-- a tenant's own): a table read instead of a C function call of about a thousand
-- instructions (callgrind on Redis 7.0, bench/README.md "Round eight"). A text that is not a
-- number gives nil and is not kept; the memo holds NUMBER_MEMO_LIMIT texts at most (its count
-- under the key `true`, which no text or number equals) and is replaced when full.
local NUMBER_MEMO, NUMBER_MEMO_LIMIT = { [true] = 0 }, 256
local function number_of(text)
  local number = NUMBER_MEMO[text]
  if not number then
    number = tonumber(text)
    if number then
      local memo = NUMBER_MEMO
      if memo[true] >= NUMBER_MEMO_LIMIT then
        memo = { [true] = 0 }
        NUMBER_MEMO = memo
      end
      memo[text] = number
      memo[true] = memo[true] + 1
    end
  end
  return number
end

-- now_ms() as text, for a call that hands it to Redis more than once (a row's times): Redis
-- formats a number handed to redis.call() with sprintf every time, about 3 500 instructions
-- for a time in ms (bench/README.md, "Round three"). This is TIME's seconds joined to the
-- milliseconds' digits, the same text, made once per call.
local function now_text()
  if not NOW_TEXT then
    local digits = ms_digits()
    NOW_TEXT = NOW_TIME[1] .. digits
  end
  return NOW_TEXT
end

-- The same, for the rate limits (a call that never asked for the time reads it here).
local function clock()
  return now_ms()
end

-- Tells the servers waiting on an execution that it changed (the block at the end: waiters).
local notify, announce
-- Per-minute counters of what happened (the block at the end: trends).
local tally, tally_start, mark_busy, flush_trends

-- The limits read so far in this call, by tenant (see limits()). A script that writes a
-- tenant's configuration forgets its entry (set_limits.lua).
local LIMITS_READ = {}
-- Whether a call put something in it (begin_call() makes a new one only then; the same for
-- each per-call table below: its *_KEPT is set where it is written).
local LIMITS_KEPT = false
-- Whether a caller of limits() that needs only the first eight fields may have those read
-- alone (see limits()): start.lua, and complete.lua for a call of one report, set it.
local LIMITS_HEAD = false

-- The tenant's effective limits: its own values where set, else the server defaults.
-- Also whether the tenant is pinned to another shard (pin.lua): then its number; its
-- weight in the shard's fair share (1..1000, default 1); the limit of each of its
-- concurrency keys that has no override (nil: none); its rate limits, the tenant's and
-- each key's (as stored, see rate_of(); nil: none); its webhook address (nil: none); and,
-- while it is being deleted (tenant_drop.lua until tenant_reap.lua is done), since when (ms;
-- nil otherwise). Read once per call and tenant: a start and the release before it ask for
-- the same tenant's several times.
-- `head` says the caller uses only the first eight (the concurrency, the weight and the
-- rates: what a start needs): in a call that allows it (LIMITS_HEAD) only those are read,
-- about 20,000 instructions less than the 17 (bench/README.md, "Round ten: the completion's
-- and start's Lua"); the rest answer nil until a caller without `head` reads them all. (A
-- whole read answers false for a field not set, never nil: v[9] == nil marks the head.)
-- Only start.lua and a lone completion allow it: nothing later in such a call is likely to
-- want the rest of a tenant whose start read the head (a group of reports is: a later
-- report's end reads the counters of a tenant an earlier one's chain started).
local function limits(t, head)
  local v = LIMITS_READ[t]
  if not v or (v[9] == nil and not head) then
    -- Fields 10 to 14 are the storage bounds and counters (see "Storage" below), read here so
    -- that they cost no call of their own; the 15th is the deletion mark; the 16th and 17th
    -- spare an admission commands (`void_until` and `reg_flow`, see admit.lua).
    if head and LIMITS_HEAD then
      local h = redis_call('HMGET', K.cfg(t), 'max_concurrent', 'max_queued', 'enabled',
        'pinned', 'weight', 'max_concurrent_per_key', 'rate', 'key_rate')
      -- (A table of 21 slots, as a whole read's grows to: the numbers below in its array
      -- part. Set on the reply's table of 8 they went to its hash part, and every limits()
      -- after cost more than the shorter read saved: +1,200 instructions a run in a start
      -- of 16, probe.py start-group.)
      v = { h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], nil, nil, nil, nil, nil, nil, nil,
        nil, nil, 0, 0, 0, 0 }
    else
      v = redis_call('HMGET', K.cfg(t), 'max_concurrent', 'max_queued', 'enabled', 'pinned',
        'weight', 'max_concurrent_per_key', 'rate', 'key_rate', 'wh_url', 'max_bytes',
        'max_retained', 'u_bytes', 'u_rows', 'u_next', 'deleting', 'void_until', 'reg_flow')
    end
    -- The numbers, read from their text once (a call asks for one tenant's limits several
    -- times): kept after the 17 fields as read. By arithmetic, and only for a field that is
    -- set (most tenants set none): tonumber() is a C function call, about a thousand
    -- instructions, even of a field that is not there. set_limits.lua writes only numbers'
    -- text to these fields.
    v[18] = v[1] and v[1] + 0 or DEFAULT_MAX_CONCURRENT
    v[19] = v[2] and v[2] + 0 or DEFAULT_MAX_QUEUED
    v[20] = v[5] and v[5] + 0 or 1
    v[21] = v[6] and v[6] + 0 or nil
    -- (v[22] and v[23]: the storage bounds as numbers, once storage_refusal() needed them.)
    LIMITS_READ[t] = v
    LIMITS_KEPT = true
  end
  return v[18], v[19], v[3] ~= '0', v[4], v[20], v[21], v[7] or nil, v[8] or nil,
    v[9] or nil, v[15] or nil
end

-- ------------------------------------------------------------------------------------------
-- Rate limits (throttles), counted when an execution starts — every start, a retry's or a
-- re-run's after a lost lease too — by the generic cell rate algorithm: a limit of `starts`
-- per `per` ms with `burst` has the emission interval T = per / starts and the tolerance
-- tau = (burst - 1) * T; its state is one number, the theoretical arrival time TAT (ms), kept
-- in K.tat(t) (the tenant's) or K.key_tat(t, h) (a key's) and expiring at TAT, when the
-- bucket is full again: an idle tenant or key leaves nothing. A start conforms when
-- TAT - tau <= now, and sets TAT to max(TAT, now) + T. So any window of W ms holds at most
-- floor(W / T) + burst starts, and a backlog starts exactly one per T.
--
-- A tenant (or key) that does not conform leaves the eligible set — the shard's runnable set
-- (or its tenant's order) — and a wake-up for it goes on the shard's timer set at the time it
-- conforms again (member 'rt:<tenant>' or 'rk:<tenant>:<key digest>', see promote_due()); the
-- workers sleep until then, as for a scheduled execution. Each hold is counted in the shard's
-- counters (`throttled`).

-- A rate limit as stored ('<starts>:<per ms>:<burst>'): its T and tau (ms); nil for none.
local function rate_of(text)
  if not text then return nil end
  local n, per, burst = string.match(text, '^(%d+):(%d+):(%d+)$')
  if not n then return nil end
  local interval = tonumber(per) / tonumber(n)
  return interval, (tonumber(burst) - 1) * interval
end

-- The time (ms) from which a start conforms under the cell `tat_key` with tolerance `tau`.
local function conforms_at(tat_key, tau)
  local tat = tonumber(redis_call('GET', tat_key))
  if not tat then return 0 end
  return tat - tau
end

-- Takes one start's token from the cell `tat_key` (emission interval `interval`).
local function take_token(tat_key, interval)
  local now = clock()
  local tat = math.max(tonumber(redis_call('GET', tat_key)) or now, now) + interval
  redis_call('SET', tat_key, string.format('%.3f', tat), 'PXAT', math.ceil(tat))
end

-- Whether this call put a wake-up on the timer set (a next due time read before is stale).
local WOKE = false

-- Whether this call has set the shard's doorbell (see ring()) and not cleared it since: a
-- second ring would write what is there already. Nobody can take the marker in the middle of
-- an atomic call, so only its state at the end counts.
local RUNG = false

-- Puts a wake-up `member` on the shard's timer set at `at` (ms), ringing the doorbell when it
-- is the earliest due time (a sleeping worker learns of it, see next_due()).
local function wake_at(member, at)
  WOKE = true
  local first = redis_call('ZRANGE', K.delayed(), '0', '0', 'WITHSCORES')
  redis_call('ZADD', K.delayed(), at, member)
  redis_call('HINCRBY', K.stats(), 'throttled', 1)
  if (#first == 0 or tonumber(first[2]) > at) and not RUNG then
    redis_call('ZADD', K.bell(), '0', '1')
    RUNG = true
  end
end

-- Whether tenant t's rate lets it start now; when not, its wake-up is on the timer set.
local function tenant_rate_ok(t)
  -- (Values by position, not select(): a C function call, about a thousand instructions.)
  local _, _, _, _, _, _, rate = limits(t, true)
  local interval, tau = rate_of(rate)
  if not interval then return true end
  local at = conforms_at(K.tat(t), tau)
  if at <= clock() then return true end
  wake_at('rt:' .. t, at)
  return false
end

-- Whether key h of tenant t conforms to the tenant's per-key rate now; when not, its
-- wake-up is on the timer set.
local function key_rate_ok(t, h)
  local interval, tau = rate_of(select(8, limits(t, true)))
  if not interval then return true end
  local at = conforms_at(K.key_tat(t, h), tau)
  if at <= clock() then return true end
  wake_at('rk:' .. t .. ':' .. h, at)
  return false
end

-- A start of tenant t (with key h, nil or '' for none) takes a token of each rate that applies.
local function take_tokens(t, h)
  local _, _, _, _, _, _, rate, key_rate = limits(t, true)
  local interval = rate_of(rate)
  if interval then take_token(K.tat(t), interval) end
  if h and h ~= '' then
    interval = rate_of(key_rate)
    if interval then take_token(K.key_tat(t, h), interval) end
  end
end

-- Lists execution id of `flow` in `status` (or 'scheduled') in its tenant's listing.
-- (Every number handed to redis.call() is formatted by sprintf, a constant too: text.)
local function index_add(t, flow, status, id)
  redis_call('ZADD', K.listing(t), '0', listing_member(status, flow, id))
end

-- Takes it out of the listing under that status.
local function index_remove(t, flow, status, id)
  redis_call('ZREM', K.listing(t), listing_member(status, flow, id))
end

-- The shard's doorbell: a marker (a sorted set of one member) that a worker with a free slot
-- waits on (BZPOPMIN, on a connection of its own), so new work wakes it at once instead of
-- being polled for. Set whenever the shard may have work a worker can start now (a tenant
-- became eligible, see refresh()) or a new earliest due time (a worker then learns when to
-- wake, see next_due()); a no-op when it is set already. Redis hands it to one waiting worker,
-- whose start call sets it again while work is left (so the next idle worker is woken in turn)
-- and clears it once nothing can start. A marker taken by a worker that then died is set again
-- by the orphan scan (reclaim.lua).
local function ring()
  if RUNG then return end
  -- Text, not numbers: Redis formats each number handed to redis.call() with sprintf.
  redis_call('ZADD', K.bell(), '0', '1')
  RUNG = true
end

-- ------------------------------------------------------------------------------------------
-- Dispatch: what starts next (docs/DESIGN.md, "Admission control").
--
-- A queued execution is in exactly one of two places of its shard:
--   K.delayed()   the shard's one timer set (score: due time, ms): executions scheduled for
--                 later (`run_at`/`delay`) and retries waiting out their backoff. Row qstate
--                 'scheduled', field `run_at`. No slot.
--   K.waiting(t)  its tenant's queue (score: the order key, see order_key()): runnable now,
--                 started in order as the tenant gets slots. Row qstate 'queued' (rows of the
--                 stream model say 'waiting': the same place), field `ready_at`.
-- and K.runnable() holds the tenants that can start something now — a queue not empty and a
-- free slot (running < max_concurrent) — scored by virtual time. A start takes the tenant
-- with the least virtual time, the first execution of its queue, and one of its slots (the
-- slot is taken when an execution starts, K.slots(t) holds running executions only), then
-- advances the tenant's virtual time by QUANTUM / weight. A tenant leaving the set (idle or
-- capped) writes its virtual time (K.sched() fields `clock` and `vt:<tenant>`), and comes
-- back at max(its own, the clock): no credit is banked while it had nothing to run. The field
-- is read only when its tenant enters the set and written whenever it leaves, so it is left
-- as it is while the tenant is in the set (one HDEL less per entry) and a value behind the
-- clock is as good as none (the max() takes the clock): neither needs a read or a delete.
-- Every step is O(log n).
--
-- Concurrency keys. An execution admitted with a `concurrency_key` (row fields `ckey`, as
-- given, and `ckh`, its digest, which names the key's structures) waits in its key's queue
-- (K.key_queue(t, h), same order keys), and of that queue only the first, and only while the
-- key has room (fewer running than its limit, see key_limit()), is in K.waiting(t) too: the
-- key's one entry in its tenant's order. A start of a keyed execution adds it to the key's
-- running set (K.key_running) and offers the key's next one (key_offer()); a key at its limit
-- offers nothing and is listed in K.key_blocked(t) until a run of it ends (or a raised limit
-- walks that set, promote.lua). So a full key is simply absent from its tenant's order: it
-- never delays another key, and nothing skips over it. A key with nothing queued or running
-- has no structure left (empty sets vanish).

-- Virtual time one start costs a tenant of weight 1 (a tenant of weight w pays QUANTUM / w).
local QUANTUM = 1000

-- How far one priority step moves an execution in its tenant's order: priority p is ordered
-- as if it became runnable (p - 3) * PRIORITY_STEP_MS later than it did. So priority 1 passes
-- priority 3 work that became runnable up to 2 steps (2 minutes) before it, never more.
local PRIORITY_STEP_MS = 60000

-- The shard's start log (K.starts()) keeps about this many starts.
local START_LOG_CAP = '10000'

-- The order key of an execution that became runnable at `ready_at` (ms) with `priority`:
-- fixed then, never changed while it waits.
local function order_key(ready_at, priority)
  -- The default priority (the commonest) needs no tonumber() (a C function call, about a
  -- thousand instructions), and keeps `ready_at` as given: an admission gives its time as
  -- text, which Redis would otherwise format again (sprintf) for its ZADD.
  if priority == DEFAULT_PRIORITY then return ready_at end
  return ready_at + ((tonumber(priority) or 3) - 3) * PRIORITY_STEP_MS
end

-- The most executions of tenant t's concurrency key h may run at once: the key's override
-- (K.key_limits(t), field h: '<limit>:<key as given>'), else the tenant's
-- max_concurrent_per_key, else nil (no limit of its own: only the tenant's max_concurrent).
local function key_limit(t, h)
  local o = redis_call('HGET', K.key_limits(t), h)
  if o then return tonumber(string.sub(o, 1, string.find(o, ':', 1, true) - 1)) end
  return select(6, limits(t, true))
end

-- Whether key h of tenant t may start one more execution now: room under its limit, and a
-- token of the per-key rate (if any; when not, its wake-up is on the timer set).
local function key_open(t, h)
  local limit = key_limit(t, h)
  if limit and redis_call('SCARD', K.key_running(t, h)) >= limit then return false end
  return key_rate_ok(t, h)
end

-- Offers key h's first execution to its tenant's order (K.waiting(t)) when the key has room
-- (a no-op when it is there already); marks the key blocked when it has work but no room.
-- Returns true when the key has an execution in its tenant's order now.
local function key_offer(t, h)
  local head = redis_call('ZRANGE', K.key_queue(t, h), 0, 0, 'WITHSCORES')
  if #head > 0 and key_open(t, h) then
    redis_call('ZADD', K.waiting(t), head[2], head[1])
    redis_call('SREM', K.key_blocked(t), h)
    return true
  end
  if #head > 0 then
    redis_call('SADD', K.key_blocked(t), h)
  else
    redis_call('SREM', K.key_blocked(t), h)
  end
  return false
end

-- The shard's eligible weight (K.sched() field `weight`) as the last HINCRBY of it in this
-- call answered it, or 0 once start_entries() found the runnable set empty (nil: neither
-- happened in this call), so that eligible_weight() needs no read. Only leave() and refresh()
-- write the field in a call that answers it (start.lua, complete.lua), and only refresh()
-- adds a tenant to an empty set (with its HINCRBY).
local WEIGHT = nil

-- The runnable set's first member and its score ({} for an empty set) as release_slot() read
-- it for the chain that follows it in the same report (complete.lua sets TOP_WANTED for a
-- report that chains), so that start_entries()' first round needs no read of its own; nil
-- when not read, once taken, and after every write to the set (leave(), refresh(),
-- start_entries()): whenever it is not nil, it is what the set holds first. An idle tenant's
-- completion at a low rate asks the set once instead of a ZSCORE and a ZRANGE
-- (bench/README.md, "Round ten: the completion's and start's Lua").
local TOP, TOP_WANTED = nil, false

-- How many slots tenant SLOTS_OF held when refresh() counted them in this call (nil: not
-- counted). Only admit.lua reads it: an admission changes no slot set, so the count stays
-- true for the rest of its call (and spares the SCARD of its queue state).
local SLOTS_OF, SLOTS_HELD = nil, nil

-- Tenant t's weight `weight` (limits()' number) as the text its cfg holds, when limits() read
-- it in this call: Redis would format the number by sprintf (about 1 800 instructions).
local function weight_text(t, weight)
  local v = LIMITS_READ[t]
  if v then return v[5] or '1' end
  return weight
end

-- Takes tenant t out of the runnable set, keeping its virtual time vt for its return (see
-- "Dispatch": it comes back at max(vt, the clock), so a vt behind the clock is kept as well
-- as deleted, and the clock needs no read here). `clock` (start_entries()) is the clock the
-- caller moves the shard to in the same step: written with vt in one HSET; nil: the clock
-- stays as it stands.
local function leave(t, vt, weight, clock)
  TOP = nil
  redis_call('ZREM', K.runnable(), t)
  WEIGHT = redis_call('HINCRBY', K.sched(), 'weight', '-' .. weight_text(t, weight))
  if clock then
    redis_call('HSET', K.sched(), 'clock', clock, 'vt:' .. t, vt)
  else
    redis_call('HSET', K.sched(), 'vt:' .. t, vt)
  end
end

-- Puts tenant t in or out of the runnable set after anything changed its queue, its slots or
-- its limits: in while its queue is not empty and it has a free slot. Rings the doorbell when
-- it comes in. A caller that has just read what a read here would tell says so, and the read
-- is spared: `outside` true, t is not in the runnable set (make_runnable(), release_slot());
-- `queued` true, t's order is not empty (make_runnable() has just added to it).
-- `outside` may also be a presumption (make_runnable() for a tenant that had nothing queued,
-- see there): the entry's ZADD is NX, so a tenant found in the set after all keeps its score
-- and its weight is not counted twice. Returns true exactly then (the set held t already).
local function refresh(t, outside, queued)
  local vt = nil
  if not outside then vt = tonumber(redis_call('ZSCORE', K.runnable(), t)) end
  local eligible, weight = false, nil
  if queued or redis_call('EXISTS', K.waiting(t)) == 1 then
    local max_concurrent, _, _, pinned, w, _, _, _, _, deleting = limits(t)
    weight = w
    -- A tenant being deleted starts nothing more (its queue is being reaped).
    if not pinned and not deleting then
      local held = redis_call('SCARD', K.slots(t))
      SLOTS_OF, SLOTS_HELD = t, held
      eligible = held < max_concurrent and tenant_rate_ok(t)
    end
  end
  if eligible and not vt then
    local sched = redis_call('HMGET', K.sched(), 'clock', 'vt:' .. t)
    local at = math.max(tonumber(sched[1]) or 0, tonumber(sched[2]) or 0)
    -- (NX: a no-op where `outside` was a presumption that failed; see above.)
    TOP = nil
    if redis_call('ZADD', K.runnable(), 'NX', at, t) == 0 then return true end
    -- Its kept virtual time stays: read only at an entry, written at every leave().
    WEIGHT = redis_call('HINCRBY', K.sched(), 'weight', weight_text(t, weight))
    ring()
  elseif vt and not eligible then
    if not weight then
      local _
      _, _, _, _, weight = limits(t)
    end
    leave(t, vt, weight)
  end
end

-- Makes a queued execution runnable now, in its tenant's order. `ready_at` is when it became
-- runnable (admission, due time, or the first time for a run that went back). `fields` are
-- more fields of its row, written in the same HSET. `h` is its concurrency key's digest (nil
-- or '' for none): then it joins its key's queue, and its tenant's order only as the key's
-- first (see "Concurrency keys" above). Returns true when the tenant was in the runnable set
-- already (so it had queued work before this one). `runnable` true says the caller knows it is
-- (admit.lua, for a tenant's later admissions in one call: more work never takes a tenant out
-- of the set), and spares the read. `fresh` says the row is new (admit.lua): its queue state
-- and ready_at are the defaults (queued, created), so neither is written (see "Rows").
-- `idle` says t had nothing queued before this one (admit.lua: place()'s count was 0), so it
-- cannot be in the runnable set, which holds tenants with a queue not empty: its ZSCORE is
-- not asked (one command less for an idle tenant's admission, the commonest at a low rate),
-- and refresh()'s NX entry tells if a drifted set held it anyway (the sweeper's repairs).
-- `waiting` is K.waiting(t) when the caller made it already (admit.lua: position() takes it
-- too), else nil.
local function make_runnable(t, id, ready_at, priority, fields, h, runnable, fresh, idle, waiting)
  local at = order_key(ready_at, priority)
  if h and h ~= '' then
    local queue = K.key_queue(t, h)
    local first = redis_call('ZRANGE', queue, 0, 0)[1]
    redis_call('ZADD', queue, at, id)
    if redis_call('ZRANGE', queue, 0, 0)[1] == id then
      -- It comes first in its key now: it takes the key's place in its tenant's order.
      if first then redis_call('ZREM', K.waiting(t), first) end
      key_offer(t, h)
    end
  else
    redis_call('ZADD', waiting or K.waiting(t), at, id)
  end
  if fresh then
    redis_call('HSET', K.row(id), unpack(fields))
  else
    redis_call('HSET', K.row(id), 'q', 'queued', 'r', ready_at, unpack(fields or {}))
  end
  -- More work never makes a runnable tenant ineligible: only a tenant outside the set needs
  -- its eligibility checked.
  if runnable or (not idle and redis_call('ZSCORE', K.runnable(), t)) then return true end
  -- Outside the runnable set (just read, or presumed: `idle`), and with an order not empty
  -- when it joined it.
  return refresh(t, true, not (h and h ~= '')) or false
end

-- Schedules a queued execution to become runnable at `due` (ms): on the timer set, listed in
-- its tenant's 'scheduled' index. Rings the doorbell when it is the shard's earliest due time,
-- so that a sleeping worker learns of it (next_due()).
local function schedule(t, flow, id, due, fields)
  local first = redis_call('ZRANGE', K.delayed(), '0', '0', 'WITHSCORES')
  redis_call('ZADD', K.delayed(), due, id)
  index_add(t, flow, 'scheduled', id)
  redis_call('HSET', K.row(id), 'q', 'scheduled', 'ra', due, unpack(fields or {}))
  if #first == 0 or tonumber(first[2]) > due then ring() end
end

-- Milliseconds until the shard's earliest due time (0 when one is due), -1 when none.
local function next_due(now)
  local first = redis_call('ZRANGE', K.delayed(), '0', '0', 'WITHSCORES')
  if #first == 0 then return -1 end
  local wait = first[2] - now
  return wait > 0 and wait or 0
end

-- Makes runnable the scheduled executions whose time has come (at most `most`), each in its
-- tenant's order by its due time. Members whose row is no longer scheduled are dropped.
-- Returns what next_due() would answer afterwards: in the usual case, nothing due yet, that
-- costs one read in all.
local function promote_due(now, most)
  local first = redis_call('ZRANGE', K.delayed(), '0', '0', 'WITHSCORES')
  if #first == 0 then return -1 end
  local wait = first[2] - now
  if wait > 0 then return wait end
  local due = redis_call('ZRANGEBYSCORE', K.delayed(), '-inf', now, 'WITHSCORES', 'LIMIT', 0,
    most)
  for i = 1, #due, 2 do
    local id, at = due[i], tonumber(due[i + 1])
    redis_call('ZREM', K.delayed(), id)
    local kind = string.sub(id, 1, 3)
    local row = {}
    if kind == 'rt:' then
      -- A throttled tenant's wake-up (see "Rate limits"): its rate lets it start again.
      refresh(string.sub(id, 4))
    elseif kind == 'rk:' then
      local t, h = string.match(id, '^rk:([^:]+):(.+)$')
      if t and key_offer(t, h) then refresh(t) end
    else
      row = redis_call('HMGET', K.row(id), 's', 'q', 't', 'f', 'pr',
        'kh')
    end
    if row[1] == 'queued' and row[2] == 'scheduled' then
      index_remove(row[3], row[4], 'scheduled', id)
      make_runnable(row[3], id, at, row[5], nil, row[6])
    end
  end
  return next_due(now)
end

-- Where a queued execution stands, as the API shows it: 'scheduled' (on the timer set),
-- 'ready' (runnable, and within its tenant's free slots: it starts as soon as a worker has
-- room and the fair share gets to its tenant) or 'waiting' (behind its tenant's
-- max_concurrent, or behind its concurrency key's: then it is not in its tenant's order).
-- Its rank costs O(log n); a caller that read it already passes it as `rank` (false: not in
-- its tenant's order), and one that knows how many slots the tenant holds as `held`.
local function queue_state(t, id, qstate, rank, held)
  if qstate == 'scheduled' then return 'scheduled' end
  if rank == nil then rank = redis_call('ZRANK', K.waiting(t), id) end
  if not rank then return 'waiting' end
  local max_concurrent = limits(t)
  if rank < max_concurrent - (held or redis_call('SCARD', K.slots(t))) then return 'ready' end
  return 'waiting'
end

-- Where a runnable execution stands (the API's `queue_position`, a snapshot): how many of its
-- tenant's order come before it (0: it is next), and with a concurrency key (digest h), how
-- many of its key's queue come before it, and the key's limit (-1: none). For one whose key
-- is full (so not in its tenant's order) the first count is that of the order entries ahead
-- of its order key. O(log n). nil when it is in neither place (scheduled, or repaired soon).
-- The fourth value is its rank in its tenant's order (false when it is not in it), for
-- queue_state(). `waiting` is K.waiting(t) when the caller has it (admit.lua), else nil.
local function position(t, id, h, waiting)
  waiting = waiting or K.waiting(t)
  local rank = redis_call('ZRANK', waiting, id)
  if not h or h == '' then return rank, nil, nil, rank or false end
  local limit = key_limit(t, h) or -1
  if rank then return rank, 0, limit, rank end
  local queue = K.key_queue(t, h)
  local key_rank = redis_call('ZRANK', queue, id)
  if not key_rank then return nil, nil, nil, false end
  local at = redis_call('ZSCORE', queue, id)
  return redis_call('ZCOUNT', waiting, '-inf', '(' .. at), key_rank, limit, false
end

-- ------------------------------------------------------------------------------------------
-- Storage: what a tenant keeps on Redis, bounded per tenant (docs/DESIGN.md, "Storage
-- bounds"). An execution's logical size is ROW_BYTES + its params + its output + its error
-- message, in bytes as stored: a documented measure, not MEMORY USAGE, so that a later layout
-- keeps its meaning. Its row keeps `sz` = ROW_BYTES + #params from its admission (the part
-- that never changes); a row without it was admitted by an older build and is counted
-- nowhere, then or later. Fields of the tenant's cfg hash, read with its limits (limits():
-- no call of their own):
--   u_bytes   logical bytes of its queued, running and retained terminal executions
--   u_rows    its terminal rows retained
--   u_next    the end (Unix s) of its earliest expiry bucket: a decision after it drains
--   max_bytes, max_retained   its own bounds (absent: the server's, an argument of the scripts
--             that decide: admit.lua, retry.lua, dry_admit.lua)
-- A terminal row expires RETENTION_SECS after its terminal change, silently, so its size and
-- its row are also kept in K.retained(t), a hash of expiry buckets: field = the bucket's end
-- (Unix s, a multiple of its width: RETENTION_SECS / RETAINED_BUCKETS rounded down, at least
-- 1 s; an hour at 30 days), value '<bytes>:<rows>'. Every row of a bucket has expired at its
-- end; the tenant's next decision after it (an admission, a retry, the sweeper's recount)
-- takes the bucket off the counters and deletes it ("drains" it), so the counts fall within
-- one bucket width of the rows' expiry without a listing or a sweep meeting the rows. A retry
-- or force delete of a terminal row takes it out of its bucket at once, the bucket found
-- from the row's own expiry (PEXPIRETIME, exact: settle_terminal() sets it with PEXPIREAT).
-- The hash holds at most RETAINED_BUCKETS + 1 buckets per retention in force.
--
-- A call collects its changes (usage_of()) and writes them at its end (flush_usage()): per
-- tenant one HSET of its counters and one read and write per bucket touched, however many
-- executions the call changed (a group of admissions, or of reports, shares them). Every
-- script that can collect one calls flush_usage() (a unit test checks it).
local ROW_BYTES = 512
local RETAINED_BUCKETS = 720
-- A bucket's width (s) under the retention in force: begin_call() works it out when
-- ARGV[4] changes, not each retain() (two math calls, C functions, per completion).
local RETAINED_WIDTH = 1

-- The changes this call collected, by tenant (see usage_of()).
local USAGE = {}
local USAGE_KEPT = false
-- Whether this call is one report's (complete.lua), whose end may read its tenant's counters
-- alone (see usage_of()).
local USAGE_ALONE = false

-- Tenant t's storage counters in this call: `bytes` and `rows` as stored, the changes to
-- them (`d_bytes`, `d_rows`), the changes of buckets (`buckets`: end -> {bytes, rows}), the
-- buckets drained (`drained`: fields), and `next`, what u_next will be (`was`: as stored; both
-- numbers). `buckets` and `drained` are made by the first change of their kind (nil until
-- then): an admission makes neither, and two tables were about 2,000 instructions of a lone
-- admission (callgrind on Redis 7.0, bench/README.md "Round eight"). `webhook` is the cfg's
-- `wh_url` (nil: none), for finish().
-- The fields come from limits() (its read of the cfg's 17 fields, once per call and tenant),
-- except with `alone`: a caller that knows nothing later in its call needs t's limits (a
-- completion alone in its call, see finish()) has the cfg's four fields here read alone
-- (about 22,000 instructions less than the 17 and their parsing, bench/README.md "Round
-- ten: the completion's and start's Lua"); a limits(t) after it still reads them all.
local function usage_of(t, alone)
  local u = USAGE[t]
  if not u then
    local bytes, rows, next, webhook
    local v = LIMITS_READ[t]
    -- (A head read of the limits holds no counters: see limits().)
    if v and v[9] == nil then v = nil end
    if v or not alone then
      if not v then
        limits(t)
        v = LIMITS_READ[t]
      end
      bytes, rows, next, webhook = v[12], v[13], v[14], v[9]
    else
      local c = redis_call('HMGET', K.cfg(t), 'u_bytes', 'u_rows', 'u_next', 'wh_url')
      bytes, rows, next, webhook = c[1], c[2], c[3], c[4]
    end
    -- (Arithmetic, and only of a field that is set: see limits(). flush_usage() writes
    -- these fields, whole numbers only.)
    next = next and next + 0 or nil
    u = { bytes = bytes and bytes + 0 or 0, rows = rows and rows + 0 or 0, d_bytes = 0,
      d_rows = 0, next = next, was = next, webhook = webhook or nil }
    USAGE[t] = u
    USAGE_KEPT = true
  end
  return u
end

-- Adds `bytes` (negative: takes them off) to tenant t's logical bytes (`alone`: see
-- usage_of()).
local function count_bytes(t, bytes, alone)
  local u = usage_of(t, alone)
  u.d_bytes = u.d_bytes + bytes
end

-- Tenant t and its `flow` are members of the registries (admit.lua has just added them): the
-- cfg field `reg_flow` says so from this call's flush_usage() on (see admit.lua's header).
local function register_flow(t, flow)
  usage_of(t).flow = flow
end

-- A terminal row of tenant t of `size` logical bytes (counted already) that expires at
-- `expire_at` (ms) is retained (n = 1), or leaves its bucket before it expired (n = -1: a
-- retry, a force delete).
local function retain(t, size, expire_at, n)
  local u = usage_of(t)
  local width = RETAINED_WIDTH
  -- math.ceil() by arithmetic (a C function call is about a thousand instructions): x % 1 is
  -- x's fraction, exactly.
  local x = expire_at / 1000 / width
  local fraction = x % 1
  local e = x - fraction
  if fraction > 0 then e = e + 1 end
  e = e * width
  u.d_rows = u.d_rows + n
  local buckets = u.buckets
  if not buckets then
    buckets = {}
    u.buckets = buckets
  end
  local d = buckets[e]
  if not d then
    d = { 0, 0 }
    buckets[e] = d
  end
  d[1], d[2] = d[1] + n * size, d[2] + n
  if not u.next or e < u.next then u.next = e end
end

-- Tenant t's bytes and retained rows after every bucket that ended by `now` (ms) is drained:
-- their rows have expired. Reads the buckets only when u_next says one has ended, then the
-- hash whole (bounded, see above): once per bucket width at most. Writes nothing itself:
-- flush_usage() does (a dry run never calls it). Returns usage_of(t).
local function drain(t, now)
  local u = usage_of(t)
  if not u.next or u.next * 1000 > now then return u end
  local next = nil
  local drained = u.drained or {}
  u.drained = drained
  local all = redis_call('HGETALL', K.retained(t))
  for i = 1, #all, 2 do
    local e = tonumber(all[i])
    local b, r = string.match(all[i + 1], '^(-?%d+):(-?%d+)$')
    if e and b and e * 1000 <= now then
      u.d_bytes, u.d_rows = u.d_bytes - tonumber(b), u.d_rows - tonumber(r)
      table.insert(drained, all[i])
    elseif e and (not next or e < next) then
      next = e
    end
  end
  -- Changes this call made to buckets (only of rows that had not expired yet, so of buckets
  -- that have not ended, but a bucket is a bucket).
  local buckets = u.buckets
  if buckets then
    for e, d in pairs(buckets) do
      if e * 1000 <= now then
        u.d_bytes, u.d_rows = u.d_bytes - d[1], u.d_rows - d[2]
        buckets[e] = nil
        table.insert(drained, string.format('%d', e))
      elseif not next or e < next then
        next = e
      end
    end
  end
  u.next = next
  return u
end

-- The storage decision of an admission (and of a retry): whether tenant t may keep `size`
-- more logical bytes (an admission: its whole size; a retry: what it frees, negative) with
-- `rows` more retained rows (a retry takes its own out: -1), under its bounds (its own, else
-- the server's `max_bytes` and `max_retained`). Drains what expired first. Returns nil, or the
-- refusal as a reply: {'too_large', size, max_bytes} when `whole` (an admission larger than
-- max_bytes, which can never fit); {'storage_full', 'bytes' | 'retained', count, bound, wait}
-- with `wait` the ms until its next bucket drains (-1: none). Writes nothing.
local function storage_refusal(t, size, rows, now, max_bytes, max_retained, whole)
  local u = drain(t, now)
  local v = LIMITS_READ[t]
  -- Comparisons, not math.max(), and tonumber() only of a bound that is set: C function calls
  -- cost about a thousand instructions each (callgrind, Redis 7.0), and this runs for every
  -- admission. (`max_bytes` and `max_retained` may come as numbers or as their text.) The two
  -- numbers are kept with the tenant's limits (v[22], v[23]) for the call's later admissions
  -- of it: a call passes the same server bounds every time (an argument of the call), and
  -- two tonumber() calls were 3,700 instructions of a batch item's 166,000 (bench/README.md,
  -- "Round seven").
  -- A call of one admission (the commonest) reads them from text once more: through
  -- number_of(), a memo of the few bounds in force, not tonumber().
  if v[22] then
    max_bytes, max_retained = v[22], v[23]
  else
    max_bytes = number_of(v[10] or max_bytes)
    max_retained = number_of(v[11] or max_retained)
    v[22], v[23] = max_bytes, max_retained
  end
  if whole and size > max_bytes then return { 'too_large', size, max_bytes } end
  local bytes = u.bytes + u.d_bytes
  if bytes < 0 then bytes = 0 end
  local kept = u.rows + u.d_rows
  if kept < 0 then kept = 0 end
  if bytes + size <= max_bytes and kept + rows < max_retained then return nil end
  local wait = -1
  if u.next then
    wait = u.next * 1000 - now
    if wait < 0 then wait = 0 end
  end
  if bytes + size > max_bytes then
    return { 'storage_full', 'bytes', bytes, max_bytes, wait }
  end
  return { 'storage_full', 'retained', kept, max_retained, wait }
end

-- Writes what this call collected (see usage_of()): the counters as they are now (read in this
-- call, so one HSET writes them all), each bucket changed. A counter that comes to 0 is
-- deleted, so a tenant with nothing counted keeps no field of it.
local function flush_usage()
  -- Most calls collect nothing: then no new table either.
  if not USAGE_KEPT then return end
  for t, u in pairs(USAGE) do
    local ret = K.retained(t)
    -- The fields to set (`set`, n of them and their values) and to delete (`gone`), in plain
    -- statements: a closure and string.format() calls cost more than the writes (each C
    -- function call about a thousand instructions). A whole number goes to Redis as a number:
    -- Redis formats it as %d would (%.17g).
    local set, n, gone = {}, 0, nil
    if u.d_bytes ~= 0 then
      local bytes = u.bytes + u.d_bytes
      if bytes ~= 0 then
        set[n + 1], set[n + 2], n = 'u_bytes', bytes, n + 2
      else
        gone = { 'u_bytes' }
      end
    end
    if u.d_rows ~= 0 then
      local rows = u.rows + u.d_rows
      if rows ~= 0 then
        set[n + 1], set[n + 2], n = 'u_rows', rows, n + 2
      else
        gone = gone or {}
        gone[#gone + 1] = 'u_rows'
      end
    end
    if u.next ~= u.was then
      if u.next then
        set[n + 1], set[n + 2], n = 'u_next', u.next, n + 2
      else
        gone = gone or {}
        gone[#gone + 1] = 'u_next'
      end
    end
    if u.flow then set[n + 1], set[n + 2], n = 'reg_flow', u.flow, n + 2 end
    if n > 0 or gone then
      local cfg = K.cfg(t)
      if n > 0 then redis_call('HSET', cfg, unpack(set)) end
      if gone then redis_call('HDEL', cfg, unpack(gone)) end
    end
    if u.drained and #u.drained > 0 then redis_call('HDEL', ret, unpack(u.drained)) end
    -- (pairs() only of a table made: a C function call, and an admission changes no bucket.)
    if u.buckets then
      for e, d in pairs(u.buckets) do
        -- (The field is the bucket's end as text, for the HGET and the HSET: see num_text().)
        local field = num_text(e)
        local b, r = string.match(redis_call('HGET', ret, field) or '0:0', '^(-?%d+):(-?%d+)$')
        b, r = (tonumber(b) or 0) + d[1], (tonumber(r) or 0) + d[2]
        if b == 0 and r == 0 then
          redis_call('HDEL', ret, field)
        else
          redis_call('HSET', ret, field, string.format('%d:%d', b, r))
        end
      end
    end
  end
  USAGE = {}
  USAGE_KEPT = false
end

-- Dedup mappings, `<id>:<request fingerprint>` by the dedup key's digest, live in two forms.
-- While its execution is live (queued or running) a mapping is a field of one of its tenant's
-- 256 hash buckets (K.dedup_bucket(): the digest's first two hex digits name the bucket,
-- dedup_field() the field: the other 30). Buckets of at most 128 fields of short values stay
-- listpack-encoded on Redis's default thresholds: about 80 bytes a mapping instead of a key's
-- 184. Hash fields cannot expire on Redis 7.0, so when its execution ends the mapping moves
-- to the string key K.dedup() with the dedup TTL (dedup_end(), in the same call); a retry
-- moves it back (dedup_revive()). A string key without a TTL is a live mapping in the form of
-- an older build (relayout_dedup.lua converts them): every reader still takes it.
local function dedup_field(h) return string.sub(h, 3) end

-- A row's `dh` as the hex digest the mapping's key names are made of: at layout 5 the row
-- holds its 16 bytes (Shard::stored_digest), formatted here as public_id() formats an id.
local function digest_hex(h)
  if #h == 16 then return string.format(HEX16, string.byte(h, 1, 16)) end
  return h
end

-- A dedup mapping's value is the stored id (see "Execution ids") and the request's
-- fingerprint as the shard stores it (Shard::stored_fingerprint): `<id>:<fingerprint>`,
-- FP_LEN hex digits, up to layout 4 (49 bytes); `<id 16><fingerprint 8>` at layout 5 (24
-- bytes, no separator: a binary id may hold any byte). Read by position, the form told by
-- the length (24: layout 5's).
local FP_LEN = 16
local function mapping_id(mapped)
  if #mapped == 24 then return string.sub(mapped, 1, 16) end
  return string.sub(mapped, 1, #mapped - FP_LEN - 1)
end

-- Whether mapping value `mapped` names execution `id`.
local function maps_to(mapped, id)
  if mapped == nil or mapped == false then return false end
  if #mapped == 24 then return string.sub(mapped, 1, 16) == id end
  return string.sub(mapped, 1, #id + 1) == id .. ':'
end

-- The live execution the dedup mapping of a digest names (bucket `bucket`, its field
-- `field`, dedup_field() of the digest, string key `mapping`; the caller declared both), and
-- the request fingerprint it was admitted with; nil when the key is free. The bucket is read
-- first, the string key (a terminal mapping, or one an older build wrote) only on a miss. A
-- mapping always has its row (both are written by admit.lua and removed together); a missing row can only mean its retention ran out first,
-- so the key is free again: then the third value is true when the string key is such a
-- leftover (admit.lua deletes it as it claims the key). Reads only (dry_admit.lua shares it).
-- `fingerprint` is the caller's request's, in the shard's form (FP_LEN hex digits, or 8
-- bytes at layout 5): the id is cut by position with one string.sub (the first 16 bytes of a
-- 24-byte layout-5 value), and a mapping that ends in the fingerprint (a replay, the
-- commonest case) is compared whole; only another request's fingerprint takes
-- one more sub (each C function call about a thousand instructions, callgrind on Redis 7.0).
local function dedup_holder(bucket, mapping, field, fingerprint)
  local mapped = redis_call('HGET', bucket, field)
  local stale = nil
  if not mapped then
    mapped = redis_call('GET', mapping)
    if not mapped then return nil end
    stale = true
  end
  local id, fp
  if #mapped == 24 then
    id, fp = string.sub(mapped, 1, 16), fingerprint
    if id .. fingerprint ~= mapped then fp = string.sub(mapped, 17) end
  else
    id, fp = string.sub(mapped, 1, #mapped - #fingerprint - 1), fingerprint
    if id .. ':' .. fingerprint ~= mapped then fp = string.sub(mapped, #id + 2) end
  end
  if redis_call('EXISTS', K.row(id)) == 0 then return nil, nil, stale end
  return id, fp
end

-- Execution `id` (tenant t, dedup digest h, the row's `dh`) ended: its mapping, if it still
-- names it, leaves its bucket for the string key with the dedup TTL. A mapping an older build
-- left as a string key gets the TTL where it is. `fp` is the row's `fp` (layout 5): then the
-- mapping's value is known without reading it, `<id><fp>`, and the field is deleted unread
-- (one command less per keyed execution). Safe because a live execution's bucket field
-- always names it (admission claims a key only when dedup_holder() finds no live row); the
-- one run whose key another execution may hold, force-deleted and readmitted while its handler
-- runs, is buried (its `dl`), never finished, so it does not come here (the test
-- `dedup::a_force_deleted_runs_completion_leaves_the_readmitted_key_alone`). An HDEL that
-- deletes nothing (a live mapping an older build left as a string key) takes the read path.
local function dedup_end(t, id, h, fp)
  h = digest_hex(h)
  local bucket, field = K.dedup_bucket(t, h), dedup_field(h)
  if fp and redis_call('HDEL', bucket, field) == 1 then
    redis_call('SET', K.dedup(t, h), id .. fp, 'EX', POLICY_5)
    return
  end
  -- (With `fp` the HDEL above found no field: the mapping, if any, is a string key.)
  local mapped = not fp and redis_call('HGET', bucket, field)
  if mapped then
    if maps_to(mapped, id) then
      redis_call('HDEL', bucket, field)
      -- (ARGV[5]'s text: a number would be formatted by sprintf.)
      redis_call('SET', K.dedup(t, h), mapped, 'EX', POLICY_5)
    end
    return
  end
  local key = K.dedup(t, h)
  if maps_to(redis_call('GET', key), id) then redis_call('EXPIRE', key, DEDUP_TTL_SECS) end
end

-- A terminal execution `id` is live again (retry.lua): its mapping, if it still names it,
-- leaves the string key for its bucket and stops expiring.
local function dedup_revive(t, id, h)
  h = digest_hex(h)
  local key = K.dedup(t, h)
  local mapped = redis_call('GET', key)
  if not maps_to(mapped, id) then return end
  redis_call('DEL', key)
  redis_call('HSETNX', K.dedup_bucket(t, h), dedup_field(h), mapped)
end

-- Execution `id` is deleted (force_delete.lua): its mapping, in whichever form, goes if it
-- still names it, so the same dedup key admits a new execution.
local function dedup_release(t, id, h)
  h = digest_hex(h)
  local bucket, field = K.dedup_bucket(t, h), dedup_field(h)
  if maps_to(redis_call('HGET', bucket, field), id) then redis_call('HDEL', bucket, field) end
  local key = K.dedup(t, h)
  if maps_to(redis_call('GET', key), id) then redis_call('DEL', key) end
end

-- The admission decision (and a retry's): whether tenant t may queue one more execution.
-- max_queued counts every queued execution (scheduled, waiting and ready). Returns true, or
-- nil and a refusal ('disabled'; 'deleting' while the tenant is being deleted, see
-- tenant_drop.lua; 'full' with the queued count; 'moved' with the shard a pinned tenant lives
-- in now, see pin.lua). Writes nothing. `queued` is the tenant's queued count when the caller
-- knows it (admit.lua counts its own admissions within a call), else nil: then it is read. On
-- success the third value is that count.
-- `listing` is t's K.listing(t) when the caller has it (admit.lua declares it), else nil.
local function place(t, queued, listing)
  local _, max_queued, enabled, pinned, _, _, _, _, _, deleting = limits(t)
  if pinned then return nil, 'moved', pinned end
  if deleting then return nil, 'deleting' end
  if not enabled then return nil, 'disabled' end
  -- listing_count(t, 'queued'), its bounds written out (listing_range('queued'): '[q' and
  -- '(r'): listing_range() makes them with string.byte() and string.char(), C function calls
  -- of about a thousand instructions each, and the key's name is a concatenation, on every
  -- admission (callgrind on Redis 7.0, bench/README.md "Round eight").
  queued = queued or redis_call('ZLEXCOUNT', listing or K.listing(t), QUEUED_MIN, QUEUED_MAX)
  if queued >= max_queued then return nil, 'full', queued end
  return true, nil, queued
end

-- Releases the slot id holds (if any), and its concurrency key's (h: its digest, nil or ''
-- for none): its tenant may be runnable again, and its key's next execution joins its
-- tenant's order. Set membership makes a second release a no-op. A free slot never makes a
-- tenant less eligible, so one that is runnable already needs no other check.
-- For a completion's chain (TOP_WANTED) whether t is runnable is read as the set's first
-- member, which the chain reads next anyway (TOP): an empty set answers both, t first answers
-- both, another tenant first takes a ZSCORE more and spares the chain's read.
local function release_slot(t, id, h)
  local freed = redis_call('SREM', K.slots(t), id) == 1
  if h and h ~= '' and redis_call('SREM', K.key_running(t, h), id) == 1 and key_offer(t, h) then
    freed = true
  end
  if not freed then return end
  local runnable
  if TOP_WANTED then
    local top = redis_call('ZRANGE', K.runnable(), '0', '0', 'WITHSCORES')
    TOP = top
    runnable = top[1] == t or (top[1] ~= nil and redis_call('ZSCORE', K.runnable(), t))
  else
    runnable = redis_call('ZSCORE', K.runnable(), t)
  end
  if not runnable then refresh(t, true) end
end

-- Takes a queued execution off its queue (the timer set, or its tenant's order and its
-- concurrency key's queue; h: the key's digest, nil or '' for none).
local function unqueue(t, flow, id, qstate, h)
  if qstate == 'scheduled' then
    redis_call('ZREM', K.delayed(), id)
    index_remove(t, flow, 'scheduled', id)
    return
  end
  local was_in_order = redis_call('ZREM', K.waiting(t), id) == 1
  if h and h ~= '' then
    redis_call('ZREM', K.key_queue(t, h), id)
    -- The key's next one takes its place (or the key leaves the blocked set when empty).
    key_offer(t, h)
  end
  if was_in_order then refresh(t) end
end

-- Moves an execution between statuses in its tenant's listing (two commands on one key).
-- (index_remove() and index_add() written out: the key's name and the members' common tail
-- made once, not twice each, on every start and completion.)
local function index_move(t, flow, from, to, id)
  local listing, tail = K.listing(t), flow .. '\0' .. id
  redis_call('ZREM', listing, LISTING_CHAR[from] .. tail)
  redis_call('ZADD', listing, '0', LISTING_CHAR[to] .. tail)
end

-- Ends the lease of a running execution: out of the lease index and its holder's set, lease
-- fields gone (with the `qstate` a start leaves, see start_entries(), and the fields `drop`
-- names, if given, in the same HDEL), slot released (and its concurrency key's, h: the key's
-- digest, nil or '' for none). `row` is the row's name when the caller has made it (nil: made
-- here).
local function end_lease(t, id, owner, drop, h, row)
  redis_call('ZREM', K.leases(), id)
  if owner and owner ~= '' then redis_call('SREM', K.held(owner), id) end
  redis_call('HDEL', row or K.row(id), 'e', 'lo', 'lu', 'q',
    unpack(drop or {}))
  release_slot(t, id, h)
end

-- Puts a running execution back in its tenant's order where it stood (its `ready_at` and
-- priority: it waited its turn already). `attempt` is what the row's attempt becomes: the
-- same when the run counted (its lease was lost), one less when it did not (a graceful
-- release). The fence is never lowered.
local function requeue(t, flow, id, now, attempt, owner, h)
  end_lease(t, id, owner, nil, h)
  index_move(t, flow, 'running', 'queued', id)
  local r = redis_call('HMGET', K.row(id), 'r', 'c', 'pr')
  make_runnable(t, id, tonumber(r[1] or r[2]), r[3],
    { 's', 'queued', 'a', attempt, 'u', now }, h)
  notify(id, now)
end

-- Tells the worker holding a running execution's lease to look at it now (a cancel or a force
-- delete): the worker subscribes to this channel and asks Redis (a heartbeat) what to do, so
-- the message only shortens the wait for its next heartbeat and is safe to lose.
local function tell_holder(owner, id)
  if owner and owner ~= '' then redis_call('PUBLISH', 'sluice:stop:' .. owner, public_id(id)) end
end

-- The value of field `name` in a flat {field, value, ...} list (a stream record), or nil.
local function record_field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end

-- ------------------------------------------------------------------------------------------
-- Dead letters. The shard's stream K.dlq() holds every record; each record also has a
-- *holder*: its tenant, or '' for a record of no tenant (a poison record of schema 1, which
-- named no execution). A holder's record ids are indexed in a stream of its own (same ids, no
-- data): the tenant's K.tenant_dlq(t), the shard's K.dlq_poison() for ''. K.dlq_holders()
-- counts each holder's records (a sorted set, score = the length of its index), so the holder
-- with the most is found in O(log n). Every add, eviction and dismissal keeps the three in
-- step in the same script; an index that becomes empty is deleted, and so is its count.
--
-- Two caps bound the stream: a holder keeps at most `caps.tenant` records (its own oldest go
-- first: a tenant's flood evicts only its own), and the shard at most `caps.shard` in all
-- (when that is hit, the holder with the most records loses its oldest; the new record's own
-- holder when it holds as many). Every record evicted is counted: the shard's `dlq_evicted`
-- (in K.stats()), and its holder's in K.dlq_evicted() (a hash: holder -> records evicted).

-- Most records one call evicts; more are over a cap only after the cap was lowered, and each
-- later record evicts up to this many again until the stream is back under its caps.
local DLQ_EVICT_BUDGET = 100

-- The index stream of `holder`'s record ids.
local function dlq_index(holder)
  if holder == '' then return K.dlq_poison() end
  return K.tenant_dlq(holder)
end

-- Takes record `id` out of `holder`'s index and count (the record itself is the caller's).
-- Returns 1 when the index held it, else 0.
local function dlq_unhold(holder, id)
  local index = dlq_index(holder)
  if redis_call('XDEL', index, id) == 0 then return 0 end
  local left = redis_call('XLEN', index)
  if left == 0 then
    redis_call('DEL', index)
    redis_call('ZREM', K.dlq_holders(), holder)
  else
    redis_call('ZADD', K.dlq_holders(), left, holder)
  end
  return 1
end

-- Evicts `holder`'s oldest record from the stream and its index. Returns the records that
-- left the stream (0 or 1). A count with no index behind it is dropped (a repair) and
-- evicts nothing.
local function dlq_evict_oldest(holder)
  local oldest = redis_call('XRANGE', dlq_index(holder), '-', '+', 'COUNT', 1)[1]
  if not oldest then
    redis_call('ZREM', K.dlq_holders(), holder)
    return 0
  end
  dlq_unhold(holder, oldest[1])
  local gone = redis_call('XDEL', K.dlq(), oldest[1])
  if gone > 0 then redis_call('HINCRBY', K.dlq_evicted(), holder, gone) end
  return gone
end

-- The caps of a script's ARGV: the shard's total and a holder's own (never above the total).
local function dlq_caps(shard, tenant)
  local total = math.max(tonumber(shard), 1)
  return { shard = total, tenant = math.min(math.max(tonumber(tenant), 1), total) }
end

-- Appends a record to the shard's dead-letter stream and its holder's index, after making
-- room under the caps (see above). Never trims by XADD's MAXLEN: every record that leaves
-- leaves its index and count too.
local function dead_letter(record, caps)
  local dlq = K.dlq()
  local holder = record_field(record, 'tenant_id') or ''
  local index = dlq_index(holder)
  local evicted, budget = 0, DLQ_EVICT_BUDGET
  local own = redis_call('XLEN', index)
  while own >= caps.tenant and budget > 0 do
    evicted = evicted + dlq_evict_oldest(holder)
    own, budget = redis_call('XLEN', index), budget - 1
  end
  local total = redis_call('XLEN', dlq)
  while total >= caps.shard and budget > 0 do
    local top = redis_call('ZREVRANGE', K.dlq_holders(), 0, 0, 'WITHSCORES')
    if top[1] then
      local victim = top[1]
      if own > 0 and own >= tonumber(top[2]) then victim = holder end
      evicted = evicted + dlq_evict_oldest(victim)
      if victim == holder then own = redis_call('XLEN', index) end
    else
      -- No holder counted (records written before the counts, see dlq_reindex.lua): the
      -- shard's oldest record goes.
      local oldest = redis_call('XRANGE', dlq, '-', '+', 'COUNT', 1)[1]
      if not oldest then break end
      dlq_unhold(record_field(oldest[2], 'tenant_id') or '', oldest[1])
      evicted = evicted + redis_call('XDEL', dlq, oldest[1])
    end
    total, budget = redis_call('XLEN', dlq), budget - 1
  end
  local id = redis_call('XADD', dlq, '*', unpack(record))
  -- Ids only grow in a stream; one that cannot follow its index's last (the shard's stream
  -- deleted by hand, then a clock set back) is left out and counted rather than fail the call
  -- that dead-letters.
  local added = redis.pcall('XADD', index, id, 'r', '1')
  if type(added) == 'table' and added.err then
    redis_call('HINCRBY', K.stats(), 'dlq_unindexed', 1)
  else
    redis_call('ZADD', K.dlq_holders(), own + 1, holder)
  end
  if evicted > 0 then redis_call('HINCRBY', K.stats(), 'dlq_evicted', evicted) end
  redis_call('HINCRBY', K.stats(), 'dead_lettered', 1)
end

-- Dead-letters a run that failed for good (complete.lua) or lost its last lease (recover()):
-- the record names the execution, why and after how many attempts, and the stream entry it ran
-- from.
local function dead_letter_run(id, t, flow, reason, attempts, entry, now, message, caps)
  dead_letter({ 'execution_id', public_id(id), 'tenant_id', t, 'flow_id', flow, 'reason', reason,
    'attempts', attempts, 'source_entry', entry or '', 'at', now, 'message', message }, caps)
end

-- ------------------------------------------------------------------------------------------
-- Webhooks: the outbox. Every change a tenant's webhook reports (an execution completed,
-- failed — dead-lettered included —, cancelled or force-deleted) is appended by the script
-- that makes the change, in the same atomic step, to the tenant's outbox stream (K.outbox),
-- when the tenant has a webhook (its cfg's `wh_url`, read with its limits: no extra call for a
-- tenant without one). `serve` delivers the entries and deletes each only after its receiver
-- answered 2xx (src/delivery.rs), so a change is delivered at least once whatever stops.
--
-- An entry: type (completed | failed | cancelled | deleted), the execution id, its sequence
-- number (`seq`: the row's `whseq`, counted per execution, so a receiver can order one
-- execution's events), the time, flow, attempt, status before a deletion, error kind and
-- message of a failure, and whether it was dead-lettered. The outbox holds at most
-- WEBHOOK_OUTBOX_CAP entries (exact trim): what a full outbox evicts is counted in the
-- tenant's cfg (`wh_dropped`), as is what `serve` drops for age. An append to an empty outbox
-- publishes the tenant on WEBHOOK_CHANNEL, which wakes the deliverers at once; one to a
-- non-empty outbox needs not (a deliverer is on it, or will find it by its scan).
-- The channel name mirrors src/store/keys.rs (webhook_channel).
local WEBHOOK_OUTBOX_CAP = 10000
local WEBHOOK_CHANNEL = 'sluice:wh'

-- Appends execution id's change `kind` to tenant t's outbox, if t has a webhook. `fields`:
-- more {name, value, ...} of the entry. `hooked` true: the caller found t's webhook set
-- already (finish(): its cfg may have been read without the limits, see usage_of()).
local function outbox(t, id, kind, now, fields, hooked)
  if not hooked and not select(9, limits(t)) then return end
  local box = K.outbox(t)
  local before = redis_call('XLEN', box)
  local seq = redis_call('HINCRBY', K.row(id), 'ws', 1)
  redis_call('XADD', box, 'MAXLEN', WEBHOOK_OUTBOX_CAP, '*', 'type', kind, 'id', public_id(id),
    'seq', seq, 'at', now, unpack(fields))
  if before >= WEBHOOK_OUTBOX_CAP then
    redis_call('HINCRBY', K.cfg(t), 'wh_dropped', before + 1 - WEBHOOK_OUTBOX_CAP)
  elseif before == 0 then
    redis_call('PUBLISH', WEBHOOK_CHANNEL, t)
  end
end

-- A running execution's row gets its output or error message (`extra` sets fields, `drop`
-- removes them; a run has no output before it ends): counts the bytes that changes for a
-- counted row and returns its logical size after, nil for a row not counted. `run` holds
-- RUN_FIELDS (its `sz` and `err_msg`). `alone`: see usage_of().
local function resize(t, run, extra, drop, alone)
  local sz = run[14]
  if not sz then return nil end
  -- (Arithmetic converts the text: no tonumber() call.)
  sz = sz + 0
  local old = run[15] or ''
  local err = record_field(extra, 'em')
  if not err then
    err = old
    -- A numeric loop, and no table made for a `drop` not given.
    if drop then
      for i = 1, #drop do
        if drop[i] == 'em' then err = '' end
      end
    end
  end
  local output = record_field(extra, 'o') or ''
  count_bytes(t, #output + #err - #old, alone)
  return sz + #output + #err
end

-- The seconds of TIME (as text) and of the retention whose sum EXPIRY_MEMO[3] holds as text:
-- a memo, right for every call of the same second and retention.
local EXPIRY_MEMO = {}

-- now_ms() + RETENTION_SECS * 1000 as text (the expiry of a row that ends now): the sum's
-- seconds, formatted once a second, joined to now's milliseconds (Redis would format the
-- number by sprintf, about 3 500 instructions). RETENTION_SECS is whole (ARGV[4]).
local function expiry_text()
  local digits = ms_digits()
  local secs = NOW_TIME[1]
  if EXPIRY_MEMO[1] ~= secs or EXPIRY_MEMO[2] ~= RETENTION_SECS then
    EXPIRY_MEMO = { secs, RETENTION_SECS, string.format('%d', secs + RETENTION_SECS) }
  end
  return EXPIRY_MEMO[3] .. digits
end

-- The seconds of TIME (as text), a lease TTL (ms) and the text of their sum's seconds: a memo
-- as EXPIRY_MEMO, for lease_end_text().
local LEASE_END_MEMO = {}

-- now + ttl (ms) as text, the end of a lease that starts now: for a whole number of seconds
-- and now_ms(), the sum's seconds formatted once a second and joined to now's milliseconds
-- (string.format() is a C function call, about a thousand instructions, on every start);
-- else formatted.
local function lease_end_text(now, ttl)
  if now ~= NOW or ttl % 1000 ~= 0 then return string.format('%d', now + ttl) end
  local secs = NOW_TIME[1]
  local memo = LEASE_END_MEMO
  if memo[1] ~= secs or memo[2] ~= ttl then
    memo = { secs, ttl, string.format('%d', secs + ttl / 1000) }
    LEASE_END_MEMO = memo
  end
  return memo[3] .. ms_digits()
end

-- A row became terminal: its dedup mapping (if it still maps to it) leaves its bucket for the
-- string key that lives DEDUP_TTL_SECS more (dedup_end()), and the row itself RETENTION_SECS.
-- Until this moment neither expires. `digest` is the row's `ddh` field (nil for none), which
-- the caller has read already. `size` is the row's logical
-- size (nil for a row not counted, see "Storage"): it is retained until it expires. The expiry
-- is set as a time (PEXPIREAT), so that PEXPIRETIME reads back exactly the instant its bucket
-- was chosen by. `row` is the row's name when the caller has made it (nil: made here). `fp`
-- is the row's `fp` (layout 5, see dedup_end()), nil for none.
local function settle_terminal(t, id, digest, size, row, fp)
  if digest then dedup_end(t, id, digest, fp) end
  local expire_at = now_ms() + RETENTION_SECS * 1000
  redis_call('PEXPIREAT', row or K.row(id), expiry_text())
  if size then retain(t, size, expire_at, 1) end
end

-- The increments of the shard's counters (K.stats()) of ended runs this call collected, by
-- field: flush_trends() writes them at the call's end, one HINCRBY per field, so a call that
-- ends a group of runs (complete.lua) counts them once.
local ENDED = {}
local ENDED_KEPT = false
-- The statuses finish() ends a run in: ENDED's only fields.
local ENDED_FIELDS = { 'completed', 'failed', 'cancelled' }

-- Makes a running execution terminal: status, times, result, index, lease gone, slot released
-- (its tenant may start the next), retention and dedup TTLs. `run` is the row's RUN_FIELDS as
-- the caller read them; `extra` holds fields to set besides the status and times; `drop` names
-- fields to remove besides the lease's; `dead` says a failure is dead-lettered (for the
-- webhook's event). The hot path of every completion: the caller's one read, one write and
-- one delete of the row, whatever the outcome. The row's output or error message is counted
-- in its tenant's bytes, and the row retained (resize(), settle_terminal()).
local function finish(t, flow, id, run, status, now, extra, drop, dead)
  index_move(t, flow, 'running', status, id)
  -- (Now as text, made once: see now_text().)
  local at = now == NOW and now_text() or now
  -- (The row's name made once for its three writes: a concatenation each, else.)
  local row = K.row(id)
  redis_call('HSET', row, 's', status, 'fi', at, 'u', at,
    unpack(extra))
  end_lease(t, id, run[9], drop, run[13], row)
  announce(id, run[11], status, now)
  -- A report alone in its call reads t's counters alone (see usage_of()) when nothing after
  -- this needs t's limits: no chain follows, or its chain will find the runnable set empty
  -- (release_slot() read it, TOP). A release that made t runnable read the limits already.
  local alone = USAGE_ALONE and (not TOP_WANTED or (TOP ~= nil and TOP[1] == nil))
  settle_terminal(t, id, run[12], resize(t, run, extra, drop, alone), row, run[16])
  -- The event's fields are made only for a tenant with a webhook: its cfg field as
  -- usage_of() or limits() read it (not the call's ten values of limits() for one).
  local u, webhook = USAGE[t], nil
  if u then
    webhook = u.webhook
  else
    limits(t)
    webhook = LIMITS_READ[t][9]
  end
  if webhook then
    if status == 'failed' then
      outbox(t, id, status, now, { 'flow', flow, 'attempt', run[3],
        'err_kind', record_field(extra, 'ek') or '',
        'err_msg', record_field(extra, 'em') or '', 'dead', dead and '1' or '0' }, true)
    else
      outbox(t, id, status, now, { 'flow', flow, 'attempt', run[3] }, true)
    end
  end
  ENDED[status] = (ENDED[status] or 0) + 1
  ENDED_KEPT = true
  tally(t, status, now)
end

-- The end of a run whose row was force-deleted while it ran (`deleted` is set): the row was
-- kept only so that its slot stays taken until the handler stopped or its lease expired. Now
-- both go.
local function bury(t, id, owner, h)
  redis_call('SREM', K.deleting(t), id)
  end_lease(t, id, owner, nil, h)
  redis_call('DEL', K.row(id))
end

-- Fields recover(), finish() and complete.lua read from a running row, in this order. The
-- 14th and 15th are for the storage counters (resize()): the row's base size, and its error
-- message of an earlier attempt, which a new outcome replaces or drops; the last, `fp`
-- (layout 5), lets dedup_end() move the mapping unread.
local RUN_FIELDS = { 's', 'fe', 'a', 'm', 't', 'f', 'e',
  'x', 'lo', 'dl', 'w', 'dh', 'kh', 'z', 'em', 'fp' }

-- What happens to a running execution whose run ended without a result (its lease expired, or
-- its worker could no longer renew it): a cancelled one ends cancelled, a force-deleted one is
-- buried, one with attempts left goes back in its tenant's order where it stood (the lost run
-- counted as an attempt), the rest are dead-lettered as 'lease_lost'. `row` holds RUN_FIELDS.
-- Returns 'requeued', 'dead_lettered', 'cancelled' or 'buried'.
local function recover(id, row, now, caps)
  local tenant, flow, owner = row[5], row[6], row[9]
  if row[10] == '1' then
    bury(tenant, id, owner, row[13])
    return 'buried'
  end
  if row[8] == '1' then
    finish(tenant, flow, id, row, 'cancelled', now, {}, {})
    return 'cancelled'
  end
  local attempt, max_attempts = tonumber(row[3]), tonumber(row[4])
  if attempt >= max_attempts then
    local msg = 'lease expired on attempt ' .. attempt .. ' of ' .. max_attempts
    finish(tenant, flow, id, row, 'failed', now, { 'ek', 'lease_lost', 'em', msg },
      {}, true)
    dead_letter_run(id, tenant, flow, 'lease_lost', attempt, row[7], now, msg, caps)
    return 'dead_lettered'
  end
  requeue(tenant, flow, id, now, attempt, owner, row[13])
  redis_call('HINCRBY', K.stats(), 'reclaimed', 1)
  return 'requeued'
end

-- A started run as start.lua and adopt.lua report it: {id, fence, attempt, tenant, flow,
-- version or '', params, max_attempts, traceparent or '', tracestate or ''}.
local function run_of(id)
  local r = redis_call('HMGET', K.row(id), 'fe', 'a', 't', 'f', 'v',
    'p', 'm', 'tp', 'ts')
  return { id, r[1], r[2], r[3], r[4], r[5] or '', r[6], r[7], r[8] or '', r[9] or '' }
end

-- Whether a worker's start-capable call numbered `call` (0: unnumbered) is covered by the
-- barrier its last adopt.lua wrote: such a call had its answer lost and reaches Redis only now,
-- after the worker asked what it holds, so it must start nothing (nobody would run it).
-- The barrier is read once per call and worker (complete.lua asks once per report).
local BARRIERS = {}
local BARRIERS_KEPT = false
local function barred(consumer, call)
  if call == 0 then return false end
  local barrier = BARRIERS[consumer]
  if not barrier then
    barrier = tonumber(redis_call('GET', K.adopted(consumer))) or 0
    BARRIERS[consumer] = barrier
    BARRIERS_KEPT = true
  end
  return call <= barrier
end

-- Starts up to `count` executions for `consumer`, in the same atomic step that picks them
-- (start.lua, and complete.lua for the slot a run just freed): each time the runnable tenant
-- with the least virtual time, the first execution of its queue (see "Dispatch" above). With
-- `log` (`--start-log`), every start appends (tenant, virtual start tag, weight) to the shard's
-- start log, from which tests, the fault suite's checker and the fairness benchmark prove the
-- fair share: the tags of successive starts never go down, and a tenant's own advance by
-- QUANTUM / weight per start. Nothing else reads it, so by default no start pays its XADD
-- (nor a shard its ~10,000 entries): the starts are the same either way.
--
-- The doorbell (see ring()): a call that leaves no runnable tenant clears it (no idle worker is
-- woken for nothing), except a completion's chain that found nothing to start and rang
-- nothing (see the end); one that leaves some sets it, so another worker with a free slot is
-- woken for what remains.
--
-- Each start increments the row's `fence`, the token that heartbeats and completions name: it
-- never repeats for an execution (retry.lua does not reset it), so a run that is no longer
-- current can never pass for the current one. `attempt` counts the starts of the current run.
-- The run is listed in its worker's held set (K.held), which adopt.lua reads.
--
-- `only` (nil for every tenant) is a list of tenants: a pull worker that serves only these
-- (`POST /api/worker/lease`). Then each round takes the one of them with the least virtual
-- time, so the fair share holds among them; the shard's clock still follows the least
-- virtual time of all runnable tenants (the floor a returning tenant comes back at), never
-- the larger one a filtered pick may have.
--
-- `call` (complete.lua's chain; nil: the caller checked already) is the call's number for
-- barred(): the adoption barrier is read only once a runnable tenant is found, since with
-- none nothing would start anyway (a worker's completion at a low rate finds none: one GET
-- less). A barred call starts nothing and returns 0, {} before any write.
--
-- Returns more (1 when a tenant can still start something, else 0) and the started runs,
-- each what run_of() reports as one string: its fields joined by newlines, the params last
-- (id, fence, attempt, tenant, flow, version or '', max_attempts, traceparent or '',
-- tracestate or '', params; `runs_of` in src/store/lease.rs splits it).
local function start_entries(consumer, count, ttl, cap, now, log, only, call)
  local started = {}
  -- A completion's chain (complete.lua names its call): see the doorbell below.
  local chained = call ~= nil
  -- Whether a tenant is left in the runnable set, when the last step tells (nil: read it).
  local left = nil
  -- The shard's clock a round moved to and nothing has written yet: a round whose tenant
  -- stays runnable leaves it here, and it is written before anything that may read it
  -- (refresh(), key_offer()) and once after the rounds. Only the last survives the call, so a
  -- call of many starts of one tenant writes it once, not once a start.
  local clock_due = nil
  -- The lease's end as text, made by the call's first start (every start of it has the same).
  local until_text = nil
  -- Each round starts one execution or removes one stale member: bounded.
  for _ = 1, count * 4 + 16 do
    -- (left false: the last start emptied the set, see below.)
    if #started >= count or left == false then break end
    -- (The first round of a completion's chain takes what release_slot() read: TOP.)
    local top = TOP or redis_call('ZRANGE', K.runnable(), '0', '0', 'WITHSCORES')
    TOP = nil
    left = #top > 0
    if not left then break end
    if call then
      if barred(consumer, call) then return 0, started end
      call = nil
    end
    -- The shard's clock moves to this score: its text as Redis answered it, written as it is
    -- (a number handed to Redis is formatted by sprintf).
    local clock_at = top[2]
    if only then
      -- The least virtual time among the served tenants that are runnable.
      local scores = redis_call('ZMSCORE', K.runnable(), unpack(only))
      top = {}
      for i, score in ipairs(scores) do
        -- (Arithmetic converts the score's text: no tonumber() calls.)
        if score and (not top[2] or score + 0 < top[2]) then
          top = { only[i], score + 0 }
        end
      end
      if not top[1] then break end
    end
    -- (Arithmetic converts the score's text: no tonumber() call. The start log takes the
    -- text.)
    local tenant, vt_text = top[1], top[2]
    local vt = vt_text + 0
    -- (Key names made once a round: each a new string of several parts.)
    local waiting = K.waiting(tenant)
    local popped = redis_call('ZPOPMIN', waiting)
    local id = popped[1]
    local row, row_key = nil, nil
    if id then
      row_key = K.row(id)
      row = redis_call('HMGET', row_key, 's', 'q', 'a', 'm',
        't', 'f', 'x', 'fe', 'v', 'p', 'w', 'r',
        'c', 'kh', 'tp', 'ts')
    end
    local key = row and row[14]
    if not id or row[1] ~= 'queued' or row[2] == 'scheduled' or row[5] ~= tenant then
      -- An empty queue, or a member whose row is gone or moved on (repair): look again.
      if id then redis_call('HINCRBY', K.stats(), 'repaired_stale_queue', 1) end
      if clock_due then
        redis_call('HSET', K.sched(), 'clock', clock_due)
        clock_due = nil
      end
      refresh(tenant)
      left = nil
    elseif key and not key_open(tenant, key) then
      -- Its key's limit was lowered while it stood first in the tenant's order: it stays in
      -- its key's queue only, until a run of the key ends (key_offer()).
      redis_call('SADD', K.key_blocked(tenant), key)
      if clock_due then
        redis_call('HSET', K.sched(), 'clock', clock_due)
        clock_due = nil
      end
      refresh(tenant)
      left = nil
    else
      local flow = row[6]
      local max_concurrent, _, _, _, weight = limits(tenant, true)
      local slots = K.slots(tenant)
      redis_call('SADD', slots, id)
      take_tokens(tenant, key)
      if key then
        if clock_due then
          redis_call('HSET', K.sched(), 'clock', clock_due)
          clock_due = nil
        end
        redis_call('ZREM', K.key_queue(tenant, key), id)
        redis_call('SADD', K.key_running(tenant, key), id)
        key_offer(tenant, key)
      end
      -- (The weight's text as its tenant's cfg holds it: the number came from it.)
      if log then
        redis_call('XADD', K.starts(), 'MAXLEN', '~', START_LOG_CAP, '*', 't', tenant,
          'vt', vt_text, 'w', LIMITS_READ[tenant][5] or '1')
      end
      local next_vt = vt + QUANTUM / weight
      -- The shard's clock moves to clock_at: in the same HSET as the tenant's kept virtual
      -- time when it leaves the set, else later (clock_due, above).
      if redis_call('EXISTS', waiting) == 1
        and redis_call('SCARD', slots) < max_concurrent and tenant_rate_ok(tenant) then
        redis_call('ZADD', K.runnable(), next_vt, tenant)
        clock_due = clock_at
        TOP = nil
      else
        leave(tenant, next_vt, weight, clock_at)
        clock_due = nil
        -- The eligible weight its HINCRBY answered is the sum of the weights (each at least 1)
        -- of the tenants left in the set: above 0 exactly while one is, so neither the next
        -- round's ZRANGE nor the final EXISTS needs asking when none is.
        left = WEIGHT > 0
      end
      -- (Arithmetic converts the text: no tonumber() calls.)
      local attempt = (row[3] or 0) + 1
      local fence = (row[8] or 0) + 1
      -- The lease's end, as text once a call (the row and the lease index take it).
      until_text = until_text or lease_end_text(now, ttl)
      index_move(tenant, flow, 'queued', 'running', id)
      -- The row keeps its `qstate` field while it runs (one HDEL less per start): it is read
      -- only while the status is 'queued', whatever queues the execution again writes it,
      -- and end_lease() drops it with the lease fields.
      -- (Now as text, made once: see now_text().)
      local at = now == NOW and now_text() or now
      -- (The attempt and the fence, small whole numbers, as text: see num_text(). The run's
      -- line below takes the same texts.)
      local attempt_text, fence_text = num_text(attempt), num_text(fence)
      redis_call('HSET', row_key, 's', 'running', 'a', attempt_text, 'fe', fence_text,
        'st', at, 'u', at, 'lo', consumer, 'lu', until_text)
      redis_call('ZADD', K.leases(), until_text, id)
      redis_call('SADD', K.held(consumer), id)
      -- What run_of() reports, from what was read above (no second read), as one line: Redis
      -- turns each table of a reply into its answer at about 1,500 instructions and 1,000 an
      -- element, a string at a fraction (bench/README.md, "Round eight: the start's Lua").
      -- No field but the last holds a newline (ids, numbers, a version and a trace context
      -- are refused with control characters at admission), so the params, which may, end it.
      -- (A missing field stays a field, empty, which the reader refuses as before.)
      started[#started + 1] = id .. '\n' .. fence_text .. '\n' .. attempt_text .. '\n'
        .. tenant .. '\n' .. flow .. '\n' .. (row[9] or '') .. '\n' .. (row[4] or '') .. '\n'
        .. (row[15] or '') .. '\n' .. (row[16] or '') .. '\n' .. (row[10] or '')
      announce(id, row[11], 'running', now)
      -- When it became runnable: `r`, else its creation `c` (always written).
      tally_start(tenant, (row[12] or row[13]) + 0, now)
    end
  end
  if clock_due then redis_call('HSET', K.sched(), 'clock', clock_due) end
  local more = 0
  -- With `only`, the doorbell still speaks for every tenant of the shard (an empty set is
  -- empty for all).
  if left == nil or (only and left) then left = redis_call('EXISTS', K.runnable()) == 1 end
  if left then
    more = 1
    ring()
  else
    -- A completion's chain that started nothing and rang nothing leaves the doorbell be: a
    -- start that emptied the set cleared it, so with the set empty it is set only for a due
    -- time (schedule()), which the idle workers should learn anyway; at worst it wakes one
    -- of them for one start call that finds nothing and clears it. (One DEL less for most
    -- completions of a quiet shard: the chain finds nothing there.)
    if not chained or #started > 0 or RUNG then redis_call('DEL', K.bell()) end
    RUNG = false
    -- Nothing is runnable: nothing is eligible either (eligible_weight() needs no read).
    WEIGHT = 0
  end
  return more, started
end

-- The weight of the tenants that can start something in this shard now (the workers share
-- their slots between shards in proportion to it). With `only` (a pull lease serving these
-- tenants, see start_entries()), the weight of those of them that can: what that lease's
-- share of the shard should follow, whatever the shard's other tenants wait with.
local function eligible_weight(only)
  -- None runnable (the call found or left the set empty): none of `only` either.
  if WEIGHT == 0 then return 0 end
  if not only then
    -- Written in this call already: its HINCRBY answered it.
    if WEIGHT then return WEIGHT end
    -- (Arithmetic converts the string: no tonumber() call.)
    local weight = redis_call('HGET', K.sched(), 'weight')
    return weight and weight + 0 or 0
  end
  local sum = 0
  for i, score in ipairs(redis_call('ZMSCORE', K.runnable(), unpack(only))) do
    if score then
      local _, _, _, _, weight = limits(only[i], true)
      sum = sum + weight
    end
  end
  return sum
end

-- An execution's row as the API reads it: the hash, plus `qs`, its queue state (see
-- queue_state()) while it is queued, and while it is runnable its position (position()):
-- `qpt` (tenant), `qpk` (key) and `qkl` (the key's limit, -1 for none).
local function view(id)
  local row = redis_call('HGETALL', K.row(id))
  local status, tenant, qstate, h = nil, nil, nil, nil
  for i = 1, #row, 2 do
    local f = row[i]
    if f == 's' then status = row[i + 1]
    elseif f == 't' then tenant = row[i + 1]
    elseif f == 'q' then qstate = row[i + 1]
    elseif f == 'kh' then h = row[i + 1] end
  end
  if status == 'queued' and tenant then
    local rank = nil
    if qstate ~= 'scheduled' then
      local pos = { position(tenant, id, h) }
      rank = pos[4]
      for i, name in ipairs({ 'qpt', 'qpk', 'qkl' }) do
        if pos[i] then
          table.insert(row, name)
          table.insert(row, tostring(pos[i]))
        end
      end
    end
    table.insert(row, 'qs')
    table.insert(row, queue_state(tenant, id, qstate, rank))
  end
  return row
end

-- ------------------------------------------------------------------------------------------
-- Waiters: telling the servers that wait on an execution (GET /api/executions/{id}?wait=...,
-- GET /api/executions/{id}/events) that it changed. watch.lua records in the row's `watch`
-- field until when (ms, Redis time) somebody waits; every change of an execution's status or
-- queue state calls notify(), which publishes on the execution's channel only while that is
-- in the future, so an execution nobody waits on costs one HMGET per change and nothing
-- else. PUBLISH is not a key operation: on a cluster Redis forwards it to every node, so a
-- server subscribed on any node hears it. The message is the new status (or 'deleted'); a
-- server re-reads the row anyway, so it only says that something changed.
--
-- The channel name mirrors src/store/keys.rs (events_channel).
local EVENTS_CHANNEL = 'sluice:ev:'

-- Publishes `what` for execution id when `watch` (the row's field, or nil) is in the future.
announce = function(id, watch, what, now)
  if watch and tonumber(watch) > now then
    redis_call('PUBLISH', EVENTS_CHANNEL .. public_id(id), what)
  end
end

-- After a change of execution id's row: tells its waiters, if it has any.
notify = function(id, now)
  local row = redis_call('HMGET', K.row(id), 'w', 's')
  announce(id, row[1], row[2], now)
end

-- Before execution id's row is deleted (or hidden as deleted): tells its waiters it is gone.
local function notify_deleted(id, now)
  announce(id, redis_call('HGET', K.row(id), 'w'), 'deleted', now)
end

-- ------------------------------------------------------------------------------------------
-- Trends: per-minute counters of each tenant, and of the whole shard, written by the scripts
-- that change state (no extra round trip): admissions, starts, completions, failures (dead
-- letters included), cancellations, and a histogram of the waiting time of starts.
--
-- One string per tenant per UTC day (K.trends), one per shard per day (K.shard_trends), each
-- of 1440 fixed-size records (one per minute of the day), updated with BITFIELD ... OVERFLOW
-- SAT (a counter stops at its largest value, never wraps). A record is TREND_RECORD_BITS
-- bits: five u32 counters (TREND_FIELD), then from bit TREND_WAIT_AT eight u16 counts of
-- starts by waiting time (upper bounds TREND_WAIT_BOUNDS ms; the eighth holds every longer
-- wait).
-- 1440 x 36 bytes = 51,840 bytes at most per key: a tenant costs at most one such key per
-- day it was active. A day key expires 25 hours after its day ends (EXPIREAT, sent by the
-- first write of a counter in a minute, so by the one that creates the key), so the last 24
-- hours can always be read.
--
-- K.busy is the shard's set of tenants that may have queued or running executions, added at
-- admission (unless the tenant was runnable already, see mark_busy) and retry. A terminal
-- change does not take its tenant out (that would cost every completion two index reads): a
-- member left with nothing is removed by the sweeper's next pass over its tenant
-- (sweep.lua). Readers list "tenants with work now" from it, registered or not, and check
-- each member's indexes.
--
-- A call collects its increments (trend_add) and writes them at its end, one BITFIELD per
-- key (flush_trends): a completion that chains the next start, or a start call of eight,
-- costs two BITFIELD calls, not two per event. Every script that can reach tally() or
-- tally_start() calls flush_trends() before it returns (a unit test of the composed scripts
-- checks it).
--
-- The layout mirrors src/store/trends.rs and the key names src/store/keys.rs; change both
-- together. Call sites: admit.lua (admitted), start_entries (a start), finish() (completed,
-- failed, cancelled), cancel.lua (a queued execution cancelled), retry.lua (mark_busy).
--
-- K.burst(t) holds when tenant t's current burst of starts began (ms): written by the first
-- start of a minute that follows a minute without one, so once per burst, and read nowhere in
-- Lua. The forecast (src/store/forecast.rs) measures a tenant that just became busy from it
-- rather than from the start of that minute, which would dilute its rate. The minute before is
-- read only by a call that makes the first start of a minute (BITFIELD tells it), so the cost
-- is one read per tenant and minute with starts, and one write per burst. It expires after
-- 10 minutes, longer than the forecast's window.
function K.trends(t, day) return P .. 't:' .. t .. ':m:' .. day end
function K.shard_trends(day) return P .. 'm:' .. day end
function K.busy() return P .. 'busy' end
function K.burst(t) return P .. 't:' .. t .. ':burst' end

local TREND_RECORD_BITS = 288
local TREND_FIELD = { admitted = 0, started = 32, completed = 64, failed = 96, cancelled = 128 }
local TREND_WAIT_AT = 160
local TREND_WAIT_BOUNDS = { 10, 40, 150, 600, 2500, 10000, 30000 }

-- The increments this call has collected, as the BITFIELD calls that will write them:
-- TREND_KEYS lists the keys in first-use order; TREND_ARGS[key] is the key's whole command
-- (BITFIELD key OVERFLOW SAT, then INCRBY width offset n per counter), TREND_EXPIRY[key] the
-- key's expiry (Unix seconds). A counter's n is found by its offset's text in the command (a
-- scan of its few counters: a table of positions per key cost a new table each call).
local TREND_KEYS, TREND_ARGS, TREND_EXPIRY = {}, {}, {}
-- For a tenant's day key, the first start this call counts in it: the position of its
-- counter's n in TREND_ARGS[key] (TREND_FIRST), its tenant and time (plain values in three
-- tables rather than a new table per call).
local TREND_FIRST, TREND_FIRST_T, TREND_FIRST_NOW = {}, {}, {}
local TRENDS_KEPT = false
local BURST_TTL_MS = 600000
-- The day trend_add() last named keys for, and its text. A memo (the name ends in _MEMO): a
-- pure function of what it is keyed by, so what a call leaves in it is right for the next,
-- and begin_call() leaves it be.
local DAY_MEMO = {}
-- The minute trend_add() last wrote in (Unix minutes) and the counters' offsets in its records
-- as text, by offset: a memo (BITFIELD's offsets, handed to Redis as numbers, would be
-- formatted by sprintf at every call; a minute has 13 counters).
local MINUTE_MEMO = {}

-- Collects one increment of the counter at `field` (an offset within a record) of the minute
-- of `now`, and of the one at `field2` if given, in tenant t's day key and in the shard's
-- (the key names made once for both); `n` increments at once instead (one counter only).
local function trend_add(t, now, field, field2, n)
  -- Whole days and minutes by arithmetic (now >= 0): no math.floor() calls (a C function
  -- call each, about a thousand instructions).
  local in_day = now % 86400000
  local day = (now - in_day) / 86400000
  local minute = (in_day - in_day % 60000) / 60000
  local unix_minute = (now - now % 60000) / 60000
  if MINUTE_MEMO[1] ~= unix_minute then MINUTE_MEMO = { unix_minute, {} } end
  local offsets = MINUTE_MEMO[2]
  -- The day's number as text for the key names, formatted once a day (a number joined into
  -- a string is formatted by sprintf every time).
  if DAY_MEMO[1] ~= day then DAY_MEMO = { day, tostring(day) } end
  local day_text = DAY_MEMO[2]
  local tenant_key, shard_key = K.trends(t, day_text), K.shard_trends(day_text)
  for c = 1, field2 and 2 or 1 do
    local f = c == 1 and field or field2
    local at = minute * TREND_RECORD_BITS + f
    local at_text = offsets[at]
    if not at_text then
      at_text = string.format('%d', at)
      offsets[at] = at_text
    end
    local width = f < TREND_WAIT_AT and 'u32' or 'u16'
    for i = 1, 2 do
      local key = i == 1 and tenant_key or shard_key
      local args = TREND_ARGS[key]
      if not args then
        args = { 'BITFIELD', key, 'OVERFLOW', 'SAT' }
        TREND_ARGS[key] = args
        TRENDS_KEPT = true
        TREND_KEYS[#TREND_KEYS + 1] = key
        TREND_EXPIRY[key] = (day + 1) * 86400 + 25 * 3600
      end
      local k, slot = #args, nil
      for j = 7, k, 4 do
        if args[j] == at_text then
          slot = j + 1
          break
        end
      end
      if slot then
        -- (A number from here on: '1' + 1.)
        args[slot] = args[slot] + (n or 1)
      else
        -- The increment as text while it is 1 (see count_of()).
        args[k + 1], args[k + 2], args[k + 3], args[k + 4] = 'INCRBY', width, at_text,
          (n and n ~= 1) and n or '1'
        if i == 1 and f == TREND_FIELD.started and not TREND_FIRST[key] then
          TREND_FIRST[key], TREND_FIRST_T[key], TREND_FIRST_NOW[key] = k + 4, t, now
        end
      end
    end
  end
end

-- The increment at args[i] of a BITFIELD trend_add() made, as a number (it is the text '1'
-- until a second increment of the same counter in the call).
local function count_of(args, i)
  local n = args[i]
  if n == '1' then return 1 end
  return n
end

-- A call's first start in tenant t's minute was the minute's first (`replies`: the BITFIELD
-- answer of its day key): when the minute before had none, a burst begins now (K.burst).
local function note_burst(key, args, replies)
  local slot = TREND_FIRST[key]
  if not slot or replies[(slot - 4) / 4] ~= count_of(args, slot) then return end
  local t, now = TREND_FIRST_T[key], TREND_FIRST_NOW[key]
  local in_day = now % 86400000
  local day = (now - in_day) / 86400000
  local minute = (in_day - in_day % 60000) / 60000
  local before, at = key, (minute - 1) * TREND_RECORD_BITS + TREND_FIELD.started
  if minute == 0 then
    before, at = K.trends(t, day - 1), 1439 * TREND_RECORD_BITS + TREND_FIELD.started
  end
  if redis_call('BITFIELD', before, 'GET', 'u32', at)[1] == 0 then
    redis_call('SET', K.burst(t), now, 'PX', BURST_TTL_MS)
  end
end

-- Writes what trend_add() collected: one BITFIELD per key. BITFIELD answers each counter's new
-- value; one equal to its increment was at 0 in its minute, so the expiry is set by the write
-- that creates the key, and not by every write after it. Also writes the shard's counters of
-- the runs the call ended (ENDED, see finish()).
flush_trends = function()
  -- A call that counted nothing (a repeated report, a replayed admission) makes no new tables.
  if TREND_KEYS[1] then
    -- Numeric loops (ipairs() calls its C iterator once a step), and the tables emptied in
    -- place rather than replaced: five new tables a call cost more than these few writes.
    for k = 1, #TREND_KEYS do
      local key = TREND_KEYS[k]
      local args = TREND_ARGS[key]
      local replies = redis_call(unpack(args))
      for i = 1, #replies do
        if replies[i] == count_of(args, 4 + 4 * i) then
          redis_call('EXPIREAT', key, TREND_EXPIRY[key])
          break
        end
      end
      note_burst(key, args, replies)
      TREND_ARGS[key], TREND_EXPIRY[key] = nil, nil
      TREND_FIRST[key], TREND_FIRST_T[key], TREND_FIRST_NOW[key] = nil, nil, nil
      TREND_KEYS[k] = nil
    end
    TRENDS_KEPT = false
  end
  -- The shard's counters of ended runs (see finish()).
  if ENDED_KEPT then
    -- (1 as text: a number is formatted by sprintf. A numeric loop over the three statuses
    -- finish() counts, not pairs() and its C iterator; the table emptied in place.)
    for i = 1, 3 do
      local field = ENDED_FIELDS[i]
      local n = ENDED[field]
      if n then
        redis_call('HINCRBY', K.stats(), field, n == 1 and '1' or n)
        ENDED[field] = nil
      end
    end
    ENDED_KEPT = false
  end
end

-- Counts one event of tenant t at `now`: 'admitted', 'completed', 'failed' or 'cancelled'
-- (a start goes through tally_start); `n` events at once (nil: one).
tally = function(t, what, now, n)
  trend_add(t, now, TREND_FIELD[what], nil, n)
end

-- Counts a start of tenant t at `now`, and its waiting time: from `ready_at`, when the
-- execution became runnable (its admission, its due time, or its retry), to now — so a
-- scheduled execution's wait does not count the time it was not due.
tally_start = function(t, ready_at, now)
  local wait = now - ready_at
  local bucket = #TREND_WAIT_BOUNDS
  -- A numeric loop: ipairs() calls its C iterator once a step.
  for i = 1, bucket do
    if wait <= TREND_WAIT_BOUNDS[i] then
      bucket = i - 1
      break
    end
  end
  trend_add(t, now, TREND_FIELD.started, TREND_WAIT_AT + 16 * bucket)
end

-- Tenant t has queued work (an admission, a retry): in the shard's busy set. An admission to a
-- tenant that was runnable already skips this (a runnable tenant had queued work, so it is a
-- member: the sweeper takes out only tenants with none, and puts back any it finds with some).
mark_busy = function(t)
  redis_call('SADD', K.busy(), t)
end

-- ------------------------------------------------------------------------------------------
-- Per-call state. The library (src/store/compose.rs) defines everything above once per load,
-- so its locals outlive a call: begin_call() runs before each shard function's own first line
-- and sets afresh every local above that a call may change, and the policy values of
-- ARGV[2..5]. A call never sees what the call before it left (an error half-way included).
-- `scripts::tests::every_local_a_call_changes_is_reset_by_begin_call` checks the list.
-- A table is replaced only when the call before put something in it (its *_KEPT flag, set
-- beside the one line that writes it): most calls leave most of them empty (flush_trends()
-- and flush_usage() empty theirs), and a new table costs about a thousand instructions with
-- its collection, as does a call of next() to look inside (callgrind, Redis 7.0).
-- The texts of ARGV[2..5] the numbers above were read from (declared at the top: a helper
-- hands POLICY_5 to Redis as it is). Reading a number from text is a strtod() (about a
-- thousand instructions, callgrind on Redis 7.0); Lua strings are interned, so the same text
-- again is one pointer comparison, and keeps its number (the policy changes only with the
-- server's flags).

local function begin_call()
  local a2, a3, a4, a5 = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
  if a2 ~= POLICY_2 then DEFAULT_MAX_CONCURRENT, POLICY_2 = a2 + 0, a2 end
  if a3 ~= POLICY_3 then DEFAULT_MAX_QUEUED, POLICY_3 = a3 + 0, a3 end
  if a4 ~= POLICY_4 then
    RETENTION_SECS, POLICY_4 = a4 + 0, a4
    RETAINED_WIDTH = math.max(1, math.floor(RETENTION_SECS / RETAINED_BUCKETS))
  end
  if a5 ~= POLICY_5 then DEDUP_TTL_SECS, POLICY_5 = a5 + 0, a5 end
  NOW, NOW_TIME, NOW_TEXT = nil, nil, nil
  WOKE = false
  RUNG = false
  WEIGHT = nil
  LIMITS_HEAD = false
  TOP, TOP_WANTED = nil, false
  USAGE_ALONE = false
  SLOTS_OF, SLOTS_HELD = nil, nil
  if LIMITS_KEPT then
    LIMITS_READ = {}
    LIMITS_KEPT = false
  end
  if USAGE_KEPT then
    USAGE = {}
    USAGE_KEPT = false
  end
  if ENDED_KEPT then
    ENDED = {}
    ENDED_KEPT = false
  end
  if BARRIERS_KEPT then
    BARRIERS = {}
    BARRIERS_KEPT = false
  end
  if TRENDS_KEPT then
    TREND_KEYS, TREND_ARGS, TREND_EXPIRY = {}, {}, {}
    TREND_FIRST, TREND_FIRST_T, TREND_FIRST_NOW = {}, {}, {}
    TRENDS_KEPT = false
  end
end
