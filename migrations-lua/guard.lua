-- guard.lua: the fences every sluice script runs before anything else. Not an operation on its
-- own: src/store/scripts.rs composes each script as
--   <the operation's own shebang line> + guard.lua + [what it uses of common.lua (shard
--   scripts) or acl_keys.lua (access scripts)] + operation
-- so the `#!lua` shebang is always the first line (Redis 7 then checks, on a cluster, that
-- every key the script touches is in the slot of the keys it declared).
--
-- Calling convention shared by every script:
--   ARGV[1]  the key prefix of the one hash tag the call works in: a shard ("sluice:{s07.19}:"),
--            or the access data ("sluice:{acl}:").
--   KEYS[1]  the freeze marker under that prefix, <prefix>hold (builds of layouts 1 and 2
--            checked <prefix>frozen: `sluice migrate-layout` sets that one to stop them)
--   KEYS[2..] every other key whose name follows from the call's arguments (each script's
--            header lists them); keys found only in data read inside (ids popped from a set or
--            read from a stream, a row's flow or status) are built from ARGV[1].
--   redis_call  is redis.call, a local the composer sets before the first line of every
--            function and script (src/store/compose.rs says why): the Lua calls Redis by it.
--
-- The fences, in order:
--   1. ARGV[1] has the shape of a sluice prefix with a hash tag, and every KEYS[i] starts with
--      it: a call whose keys and prefix disagree (a wrong shard tag) fails loudly here, also on
--      a standalone Redis, where nothing else would notice.
--   2. KEYS[1] is exactly the prefix's freeze marker.
--   3. While the marker exists (a slot move is under way) the script refuses with a TRYAGAIN
--      error and has touched nothing: the caller treats it as "did not run, retry later".
--
-- What the fences cost. Each check is a pure function of strings (the prefix's shape, "this
-- key starts with this prefix"), so what passed once is remembered: FENCE_OK[key] is the
-- prefix the key was found to start with, FENCE_FROZEN[prefix] the freeze marker of a prefix
-- of the right shape (and FENCE_BUILT, see declared_shard() in common.lua). They are the
-- composer's locals (src/store/compose.rs): in the library
-- they live as long as it does, so a key met again (a shard's and a tenant's keys, on nearly
-- every call) costs one table read instead of a string.find (about 1,200 instructions each,
-- measured with callgrind on Redis 7.0); a new key (a new execution's row) is checked in
-- full. Only what passed is remembered, and all are dropped together once they hold
-- FENCE_LIMIT names, so they stay small whatever the callers send. The guarantee is the same
-- on a standalone Redis (which checks nothing itself) as on a cluster (which also refuses keys
-- of another slot): a key that does not start with the prefix is refused before anything runs.
P = ARGV[1]
local fence_frozen = FENCE_FROZEN[P]
if not fence_frozen then
  if type(P) ~= 'string' or not string.find(P, '^sluice:{[^{}]+}:$') then
    return redis.error_reply('ERR sluice fence: ARGV[1] is not a key prefix: ' .. tostring(P))
  end
  fence_frozen = P .. 'hold'
  FENCE_FROZEN[P] = fence_frozen
  FENCE_COUNT = FENCE_COUNT + 1
end
-- The loop reads locals, not the library's upvalues (two VM instructions fewer a key).
local fence_ok, keys, prefix = FENCE_OK, KEYS, P
for i = 1, #keys do
  local key = keys[i]
  if fence_ok[key] ~= prefix then
    -- A plain find anchored at 1: no pattern, no substring allocated.
    if string.find(key, prefix, 1, true) ~= 1 then
      return redis.error_reply('ERR sluice fence: KEYS[' .. i .. '] ' .. key ..
        ' is outside the prefix ' .. prefix)
    end
    fence_ok[key] = prefix
    FENCE_COUNT = FENCE_COUNT + 1
  end
end
if FENCE_COUNT > FENCE_LIMIT then
  FENCE_OK, FENCE_FROZEN, FENCE_BUILT, FENCE_COUNT = {}, {}, {}, 0
end
if KEYS[1] ~= fence_frozen then
  return redis.error_reply('ERR sluice fence: KEYS[1] must be ' .. P .. 'hold, not ' ..
    tostring(KEYS[1]))
end
if redis_call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('TRYAGAIN shard frozen for a slot move')
end
