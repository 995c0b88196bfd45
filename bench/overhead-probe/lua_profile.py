#!/usr/bin/env python3
"""Where a script call's instructions go, by function (issue 39; bench/README.md, "Round seven:
where the Lua goes").

Reads two callgrind dumps of the same window of a symbolized redis-server (probe.py's windows,
cg.out.N, with $PROBE_REDIS_SERVER naming a build that is not stripped):

    A  the full profile (probe.py as usual)
    B  the same run with PROBE_CALLGRIND_ARGS="--toggle-collect=luaRedisGenericCommand
       --toggle-collect=luaCreateArray --toggle-collect=lua_gc": only what redis.call's C path,
       the KEYS/ARGV tables and Redis's periodic GC step cost

and prints, per call (the window's cost / CALLS):

  * the call's structure, from A's call edges (inclusive costs): the request and reply outside
    the script, FCALL's entry (KEYS/ARGV, the final reply to RESP, the GC step every 50 calls),
    redis.call's C path per part (Lua arguments to robj, lookup/ACL/checks, call()'s own
    bookkeeping, the reply RESP to Lua), the commands proper, and the script's own Lua;
  * the self cost outside those C parts (A - B, function by function) in categories: the Lua
    VM, tables, strings, Lua function calls, the collector, C library functions, number <->
    text, malloc/free, and Redis's other code.

    lua_profile.py CALLS A B [--top N]

Python's standard library only.
"""

import re, sys
from collections import defaultdict

def parse(path):
    """(names by id, object by id, self cost by id, {(caller, callee): inclusive cost},
    {(caller, callee): calls}, summary)."""
    names, obj_of, files = {}, {}, {}
    self_cost = defaultdict(int)
    edges = defaultdict(int)
    counts = defaultdict(int)
    cur_ob = cur_fn = callee = None
    ob_names = {}
    in_call = False
    summary = 0
    def ident(v, table):
        m = re.match(r'\((\d+)\)(?: (.*))?$', v)
        if not m: return v
        i = int(m.group(1))
        if m.group(2) is not None: table[i] = m.group(2)
        return i
    for line in open(path, encoding='latin-1'):
        line = line.rstrip('\n')
        if not line: continue
        c = line[0]
        if c.isdigit() or c in '+-*':
            parts = line.split()
            cost = int(parts[1]) if len(parts) > 1 else 0
            if in_call:
                if callee != cur_fn: edges[(cur_fn, callee)] += cost
                in_call = False
            else:
                self_cost[cur_fn] += cost
            continue
        key, _, val = line.partition('=')
        if key == 'ob':
            cur_ob = ident(val, ob_names)
        elif key == 'fn':
            cur_fn = ident(val, names)
            obj_of.setdefault(cur_fn, cur_ob)
        elif key == 'cob':
            cob = ident(val, ob_names)
        elif key == 'cfn':
            callee = ident(val, names)
        elif key == 'calls':
            in_call = True
            if callee != cur_fn: counts[(cur_fn, callee)] += int(val.split()[0])
        elif line.startswith('summary:'):
            summary = int(line.split()[1])
    obj = {f: ob_names.get(o, '') for f, o in obj_of.items()}
    return names, obj, self_cost, edges, counts, summary

class Profile:
    def __init__(self, path):
        self.names, self.obj, self.self_cost, self.edges, self.counts, self.summary = parse(path)
        self.by_name = defaultdict(list)
        for i, n in self.names.items(): self.by_name[n].append(i)
    def ids(self, name):
        return self.by_name.get(name, [])
    def into(self, name, callers=None):
        """Inclusive cost of calls into the functions named `name` (every recursion level's
        name, e.g. "call'2", is a name of its own), from `callers` (names) or from anyone
        outside them."""
        targets = set(self.ids(name))
        tot = 0
        for (a, b), v in self.edges.items():
            if b in targets and a not in targets:
                if callers is None or self.names.get(a) in callers: tot += v
        return tot
    def calls_into(self, name):
        targets = set(self.ids(name))
        return sum(v for (a, b), v in self.counts.items() if b in targets and a not in targets)
    def out_of(self, name, pred):
        """Inclusive cost of the calls made by `name` to callees whose name satisfies pred."""
        src = set(self.ids(name))
        return sum(v for (a, b), v in self.edges.items() if a in src and pred(self.names.get(b, '')))
    def self_by_name(self):
        d = defaultdict(int)
        for i, v in self.self_cost.items(): d[(self.names.get(i, '?'), self.obj.get(i, ''))] += v
        return d

LIBC_NUM = re.compile(r'(strtod|vfprintf|printf_fp|hack_digit|mpn_|round_and_return|str_to_mpn|'
                      r'__printf|snprintf|sprintf|vsnprintf|strchrnul|_IO_|__strtol|strtol|'
                      r'__mpn|_itoa|__GI_)')
LUA_TABLE = {'luaV_gettable', 'luaV_settable', 'mainposition', 'setarrayvector', 'setnodevector',
             'resize', 'rehash', 'numusearray', 'numusehash', 'countint', 'computesizes', 'newkey',
             'arrayindex', 'unbound_search', 'getfreepos', 'luaT_gettm', 'luaT_gettmbyobj',
             'lua_rawgeti', 'lua_rawseti', 'lua_rawget', 'lua_rawset', 'lua_gettable',
             'lua_settable', 'lua_getfield', 'lua_setfield', 'lua_createtable', 'lua_next',
             'luaH_next', 'findindex', 'lua_objlen', 'luaV_equalval'}
LUA_STRING = {'luaS_newlstr', 'luaS_resize', 'luaV_concat', 'lua_pushlstring', 'lua_pushstring',
              'luaS_newudata', 'lua_tolstring', 'luaO_pushvfstring', 'luaO_pushfstring',
              'lua_pushfstring', 'pushstr', 'luaV_tostring', 'luaO_tostring', 'lua_concat',
              'luaO_rawequalObj', 'l_strcmp', 'luaV_lessthan'}
LUA_CALLS = {'luaD_precall', 'luaD_poscall', 'luaD_call', 'luaD_growstack', 'luaD_reallocstack',
             'luaD_reallocCI', 'growCI', 'luaD_checkstack', 'lua_checkstack', 'adjust_varargs',
             'tryfuncTM', 'luaD_rawrunprotected', 'luaD_pcall', 'f_call', 'lua_pcall', 'lua_call',
             'callrethooks', 'luaD_callhook', 'lua_settop', 'lua_gettop', 'index2adr',
             'lua_type', 'lua_pushvalue', 'lua_pushnil', 'lua_pushnumber', 'lua_pushinteger',
             'lua_pushboolean', 'lua_toboolean', 'lua_remove', 'lua_insert', 'lua_replace',
             'luaF_close', 'luaF_newLclosure', 'luaF_newCclosure', 'luaF_findupval',
             'luaF_newupval', 'lua_pushcclosure', 'luaL_checkstack', 'luaL_checkany',
             'luaL_checkinteger', 'luaL_checknumber', 'luaL_optinteger', 'luaL_checklstring',
             'luaL_optlstring', 'luaL_checktype', 'lua_isnumber', 'lua_isstring', 'lua_tonumber',
             'lua_tointeger', 'luaL_argerror', 'lua_getmetatable', 'luaMaskCountHook',
             'luaRedisPcall', 'luaRedisCallCommand', 'luaRedisPCallCommand'}
LUA_GC = re.compile(r'^(luaC_|singlestep|propagatemark|reallymarkobject|sweeplist|markroot|atomic|'
                    r'propagateall|traverse|freeobj|luaF_free|luaH_free|cleartable|remarkupvals|'
                    r'marktmu|luaE_free|checkSizes|GCTM|iscleared|markmt|markobject|sweepwholelist|'
                    r'luaS_freeall|luaF_freeproto|luaF_freeclosure|luaF_freeupval|lua_gc)')
LUA_NUM = {'luaO_str2d', 'luaV_tonumber', 'luaB_tostring', 'luaB_tonumber', 'str_format',
           'addquoted', 'scanformat', 'addintlen', 'luaL_tolstring'}
MALLOC = re.compile(r'(malloc|free|realloc|calloc|^je_|^l_alloc$|^luaM_|^zmalloc|^zfree|'
                    r'^zrealloc|^tcache|^arena|^extent|^sz_|^rtree|^_int_|^sdsAllocSize|'
                    r'^malloc_consolidate|^unlink_chunk|^ztrymalloc|^zcalloc)')

def category(name, obj):
    base = name.split("'")[0]
    if 'jemalloc' in obj or MALLOC.search(base): return 'malloc/free'
    if base in ('luaV_execute', 'luaV_execute'): return 'Lua VM (luaV_execute self)'
    if base in LUA_TABLE or base.startswith('luaH_'): return 'tables (luaH_*, get/set)'
    if base in LUA_STRING: return 'strings (luaS_newlstr, concat, push)'
    if LUA_GC.search(base): return 'GC (luaC_*, mark, sweep)'
    if base in LUA_NUM or ('libc' in obj and LIBC_NUM.search(base)):
        return 'number <-> text (tostring, tonumber, format; libc)'
    if base in LUA_CALLS or base.startswith('luaD_'): return 'Lua function calls (luaD_*, C API)'
    if base.startswith(('luaB_', 'str_', 'math_', 'tconcat', 'tinsert', 'tremove', 'luaL_',
                        'lua_', 'luaO_', 'luaZ_', 'luaK_', 'luaY_', 'luaX_', 'luaU_', 'luaF_',
                        'luaT_', 'luaE_', 'luaG_', 'classend', 'match', 'singlematch',
                        'max_expand', 'push_onecapture', 'push_captures', 'lmemfind',
                        'str_find_aux', 'ipairsaux', 'auxupvalue')):
        return 'Lua library (string.find, unpack, next, ...)'
    if 'libc' in obj: return 'libc (memcmp, memcpy, strlen, ...)'
    return "Redis's other code"

def breakdown(calls, a_path, b_path):
    """(rows of the call's structure, rows of the categories, commands proper by name, the two
    profiles): each row (label, instructions per call)."""
    A, B = Profile(a_path), Profile(b_path)
    per = lambda v: round(v / calls)
    total = A.summary
    fcall = A.into('fcallCommand') + A.into('evalShaCommand') + A.into('evalCommand')
    pcall_top = A.into('lua_pcall', {'luaCallFunction'})
    karg = A.into('luaCreateArray')
    final_reply = A.into('luaReplyToRedisReply', {'luaCallFunction'})
    gc_step = A.into('lua_gc', {'luaCallFunction'})
    cpath = A.into('luaRedisGenericCommand')
    argv = (A.into('luaArgsToRedisArgv', {'luaRedisGenericCommand'}) +
            A.into('freeLuaRedisArgv', {'luaRedisGenericCommand'}) +
            A.into('freeClientArgv', {'luaRedisGenericCommand'}))
    # redisProtocolToLuaType() is inlined: its parseReply() is the conversion.
    reply = A.into('parseReply', {'luaRedisGenericCommand'})
    registry = A.into('luaGetFromRegistry', {'luaRedisGenericCommand'})
    script_call = A.into('scriptCall', {'luaRedisGenericCommand'})
    call2 = A.into("call'2", {'scriptCall'})
    procs = A.out_of("call'2", lambda n: n.endswith('Command'))
    ncmd = A.calls_into('luaRedisGenericCommand') / calls
    rows = [
        ('the request and the reply outside the script (read, parse, write; idle)', total - fcall),
        ('FCALL entry and exit, all', fcall - pcall_top),
        ('  KEYS and ARGV tables (luaCreateArray)', karg),
        ('  the final reply, Lua to RESP (luaReplyToRedisReply)', final_reply),
        ('  Redis\'s GC step (every 50 calls)', gc_step),
        ('  the rest (function lookup, run context, hook)', fcall - pcall_top - karg - final_reply - gc_step),
        ('redis.call C path, less the commands (%.1f commands a call: %d each)'
         % (ncmd, per((cpath - procs) / ncmd) if ncmd else 0), cpath - procs),
        ('  Lua arguments to robj and their release', argv),
        ('  lookup, ACL, script checks (scriptCall less call())', script_call - call2),
        ('  call() less the command (timing, stats, propagation)', call2 - procs),
        ('  the reply, RESP to Lua (redisProtocolToLuaType)', reply),
        ('  the run context from the registry (luaGetFromRegistry)', registry),
        ('  the rest (luaRedisGenericCommand itself, reply buffer)',
         cpath - argv - script_call - reply - registry),
        ('the commands proper', procs),
        ('the script\'s own Lua (lua_pcall less redis.call\'s C path)', pcall_top - cpath),
    ]
    rows = [('the whole call', total)] + rows
    # The self cost outside redis.call's C path, KEYS/ARGV and the GC step, by category.
    sa, sb = A.self_by_name(), B.self_by_name()
    cats = defaultdict(int)
    for k, v in sa.items():
        cats[category(*k)] += v - sb.get(k, 0)
    cat_rows = sorted(cats.items(), key=lambda x: -x[1])
    # Commands proper by command.
    src = set(A.ids("call'2"))
    by = defaultdict(int)
    for (a, b), v in A.edges.items():
        if a in src and A.names.get(b, '').endswith('Command'): by[A.names[b]] += v
    cmd_rows = sorted(by.items(), key=lambda x: -x[1])
    return ([(l, per(v)) for l, v in rows], [(l, per(v)) for l, v in cat_rows],
            [(l, per(v)) for l, v in cmd_rows], A, B)

def main():
    calls, a_path, b_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    top = int(sys.argv[sys.argv.index('--top') + 1]) if '--top' in sys.argv else 0
    rows, cats, cmds, A, B = breakdown(calls, a_path, b_path)
    per = lambda v: round(v / calls)
    for label, v in rows:
        print('%-72s %9d' % (label, v))
    print()
    print('self cost outside redis.call\'s C path, KEYS/ARGV and the GC step (A - B): %d per call'
          % sum(v for _, v in cats))
    for c, v in cats:
        print('  %-70s %9d' % (c, v))
    if top:
        print()
        sa, sb = A.self_by_name(), B.self_by_name()
        funcs = sorted(((v - sb.get(k, 0), k) for k, v in sa.items()), reverse=True)
        for d, (n, o) in funcs[:top]:
            print('  %9d  %-50s %s' % (per(d), n, category(n, o)))
        print('\nC path, by function (B, self):')
        fb = sorted(((v, k) for k, v in sb.items()), reverse=True)[:top]
        for v, (n, o) in fb:
            print('  %9d  %s' % (per(v), n))
    print('\ncommands proper:', ', '.join('%s %d' % (n, v) for n, v in cmds))

if __name__ == '__main__':
    main()
