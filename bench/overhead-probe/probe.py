#!/usr/bin/env python3
"""Where a call's per-call overhead goes (issue 39; bench/README.md, "Cost per execution").

The benchmark's overhead part (`sluice-bench --cost --cost-overhead-only`) gives one figure per
path: a captured call replayed under callgrind minus a bare script of the same commands. This
splits it. It replays the same captured call against *probes*: copies of the library whose
function returns early at a point (after the guard, after begin_call(), ...), and against bare
scripts of the call's first k commands; a part's overhead is the growth between two probes
minus the growth of the bare scripts over the commands that part ran.

    probe.py capture target/release/sluice   # a redis-server and `sluice serve`: admit, the
                                             # same again, lease, complete, complete again
    probe.py probes                          # the probe libraries, from the captured one
    probe.py measure 300                     # each probe and bare prefix, 300 replays each
    probe.py cycle 300 bare LIB...           # the fresh paths: 300 new admissions, starts and
                                             # completions, by a library file or bare scripts
    probe.py complete-group 300 LIB...       # a complete.lua call of 1, 8, 32 worker reports
                                             # (the capture's keys and policy arguments)
    probe.py start-group 20 LIB...           # 20 start.lua calls of 16 runs each (a worker's
                                             # grouped start), after as many admissions
    probe.py chain 300 LIB...                # 300 worker completions in a backlog, each
                                             # chaining the next run (after 616 admissions)
    probe.py capture-batch <sluice> 1000 8   # one batch of 1,000 per tenant, 8 tenants at once:
                                             # every admit.lua call, and the library
    probe.py batch 1000 8 3 [LIB]            # those calls replayed 3 times: instructions and
                                             # commands per item, calls per batch
    probe.py batch-cpu 1000 8 10 [LIB]       # the same on a plain redis-server: CPU per item
    probe.py serve-batch <sluice> 1000 8 3   # serve under callgrind: instructions per item

`measure` sends each call WARM (500) times before its counted replays, after every
`FUNCTION LOAD REPLACE` and `SCRIPT LOAD`: the first replays of a freshly loaded library pay
one-off costs (Lua's collector sweeping the replaced library, first-call caches) that moved a
figure by up to 6,400 instructions between two runs without it, 1,000 at most with it
(bench/README.md, "Round six: probe warm-up"). `cycle` and `group` make every call new, so
they cannot replay one; `group` sends 20 unmeasured calls first, `cycle` none.

Python's standard library only; needs redis-server ($PROBE_REDIS_SERVER names another),
valgrind and callgrind_control. Files go to $PROBE_DIR (default target/overhead-probe); each
counted window's callgrind dump stays there as cg.out.N until the next server starts. The probes' points are lines of admit.lua and
complete.lua (PROBES below): a moved line needs its probe moved.
"""

import json, os, socket, subprocess, sys, time, urllib.request, threading, re

OUT = os.environ.get('PROBE_DIR', 'target/overhead-probe')
# The redis-server every server here runs (the capture's and callgrind's): a symbolized build
# of the same version lets `callgrind_annotate` split a window by function (bench/README.md,
# "Round seven: where the Lua goes"); Debian's is stripped.
REDIS_SERVER = os.environ.get('PROBE_REDIS_SERVER', 'redis-server')
# More valgrind options for callgrind's server, split at spaces (e.g.
# `--toggle-collect=luaRedisGenericCommand`: count only inside redis.call's C path).
CALLGRIND_ARGS = os.environ.get('PROBE_CALLGRIND_ARGS', '').split()

def free_port():
    s = socket.socket(); s.bind(('127.0.0.1', 0)); p = s.getsockname()[1]; s.close(); return p

class R:
    def __init__(self, port, timeout=300):
        self.s = socket.create_connection(('127.0.0.1', port), timeout=timeout)
        self.f = self.s.makefile('rb')
    def send(self, *args):
        out = [b'*%d\r\n' % len(args)]
        for a in args:
            if isinstance(a, str): a = a.encode()
            if isinstance(a, int): a = str(a).encode()
            out.append(b'$%d\r\n%s\r\n' % (len(a), a))
        self.s.sendall(b''.join(out))
    def read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t == b'+': return rest.decode()
        if t == b'-': return Exception(rest.decode())
        if t == b':': return int(rest)
        if t == b'$':
            n = int(rest)
            if n < 0: return None
            d = self.f.read(n + 2)[:-2]; return d
        if t == b'*':
            n = int(rest)
            if n < 0: return None
            return [self.read() for _ in range(n)]
        raise RuntimeError(line)
    def call(self, *args):
        self.send(*args); r = self.read()
        if isinstance(r, Exception): raise r
        return r

def wait_port(port, secs=120):
    end = time.time() + secs
    while time.time() < end:
        try:
            r = R(port); r.call('PING'); return
        except Exception: time.sleep(0.2)
    raise RuntimeError('redis did not start')

def http(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body.encode() if body else None, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r: return r.status, r.read()
    except urllib.error.HTTPError as e: return e.code, e.read()

def parse_monitor(line):
    m = re.match(r'^\+[\d.]+ \[\d+ ([^\]]+)\] (.*)$', line)
    if not m: return None
    client, rest = m.group(1), m.group(2)
    args, i, b = [], 0, rest.encode('latin-1')
    while i < len(b):
        if b[i:i+1] != b'"': i += 1; continue
        i += 1; a = bytearray()
        while i < len(b) and b[i:i+1] != b'"':
            if b[i:i+1] == b'\\' and i + 1 < len(b):
                i += 1; c = b[i:i+1]
                if c == b'n': a += b'\n'
                elif c == b'r': a += b'\r'
                elif c == b't': a += b'\t'
                elif c == b'a': a += b'\x07'
                elif c == b'b': a += b'\x08'
                elif c == b'x': a.append(int(b[i+1:i+3], 16)); i += 2
                else: a += c
            else: a += b[i:i+1]
            i += 1
        i += 1; args.append(bytes(a))
    return client, args

# The platform admin token of the `sluice serve` that `serve` starts.
TOKEN = 'prof-admin-token-0123456789abcdef'

def serve(sluice, work):
    """A redis-server (no persistence of its own: its data in `work`, emptied first, when told
    to SAVE) and `sluice serve` on it (admin token TOKEN, no sweeper, limits out of the way,
    its log in work/serve.log), once ready: (Redis's port, the API's base URL, redis-server's
    process, serve's process)."""
    port = free_port(); os.makedirs(work, exist_ok=True)
    for f in os.listdir(work): os.remove(os.path.join(work, f))
    rs = subprocess.Popen([REDIS_SERVER, '--port', str(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', work, '--dbfilename', 'dump.rdb'], stdout=subprocess.DEVNULL)
    wait_port(port)
    hp = free_port()
    env = dict(os.environ, SLUICE_ADMIN_TOKEN=TOKEN, RUST_LOG='warn', SLUICE_DEFAULT_MAX_BYTES='1000000000000', SLUICE_DEFAULT_MAX_RETAINED='1000000000000')
    sv = subprocess.Popen([sluice, 'serve', '--listen', '127.0.0.1:%d' % hp, '--redis-url', 'redis://127.0.0.1:%d' % port, '--sweep-interval-secs', '0', '--default-max-concurrent', '1000000', '--default-max-queued', '1000000'], env=env, stdout=open(os.path.join(work, 'serve.log'), 'w'), stderr=subprocess.STDOUT)
    base = 'http://127.0.0.1:%d' % hp
    for _ in range(150):
        try:
            if http('GET', base + '/readyz')[0] == 200: break
        except Exception: pass
        time.sleep(0.2)
    return port, base, rs, sv

def record(port):
    """MONITOR on the Redis at `port`, read by a thread of its own into a list of lines until
    it sees `ECHO cost-mark:end` (or the connection closes): (the list, the thread)."""
    mon = R(port); mon.send('MONITOR'); assert mon.f.readline().startswith(b'+OK')
    lines = []
    def reader():
        while True:
            l = mon.f.readline()
            if not l: return
            lines.append(l.decode('latin-1').rstrip('\r\n'))
            if 'cost-mark:end' in lines[-1]: return
    th = threading.Thread(target=reader, daemon=True); th.start()
    return lines, th

def capture(sluice, out):
    port, base, rs, sv = serve(sluice, os.path.join(out, 'cap'))
    lines, th = record(port)
    own = R(port)
    h = {'Authorization': 'Bearer ' + TOKEN, 'X-Tenant-Id': 'bench-t0', 'Content-Type': 'application/json', 'Idempotency-Key': 'calls-0-0'}
    body = json.dumps({'flow_id': 'demo.echo', 'params': {'n': 0, 'p': 'x' * 14}})
    own.call('ECHO', 'cost-mark:fresh')
    s1 = http('POST', base + '/api/executions', body, h)[0]
    own.call('ECHO', 'cost-mark:replay')
    s2, b2 = http('POST', base + '/api/executions', body, h)
    own.call('ECHO', 'cost-mark:lease')
    hl = dict(h); del hl['Idempotency-Key']
    st, lb = http('POST', base + '/api/worker/lease?wait=5s', json.dumps({'worker_id': 'cost', 'max': 1, 'tenants': ['bench-t0'], 'lease': '30s'}), hl)
    run = json.loads(lb)['runs'][0]
    own.call('ECHO', 'cost-mark:complete')
    comp = json.dumps({'worker_id': 'cost', 'fence': run['fence'], 'outcome': 'completed', 'output': run['params']})
    s3 = http('POST', base + '/api/worker/runs/%s/complete' % run['execution_id'], comp, hl)[0]
    own.call('ECHO', 'cost-mark:repeat')
    s4 = http('POST', base + '/api/worker/runs/%s/complete' % run['execution_id'], comp, hl)[0]
    own.call('ECHO', 'cost-mark:end')
    th.join(30)
    print('statuses', s1, s2, st, s3, s4, file=sys.stderr)
    sv.terminate(); sv.wait()
    parsed = [p for p in map(parse_monitor, lines) if p]
    def find(frm, to, name):
        st = [i for i, (c, a) in enumerate(parsed) if len(a) == 2 and a[0].lower() == b'echo' and a[1] == ('cost-mark:' + frm).encode()][0]
        en = [i for i, (c, a) in enumerate(parsed) if len(a) == 2 and a[0].lower() == b'echo' and a[1] == ('cost-mark:' + to).encode()][0]
        for i in range(st + 1, en):
            c, a = parsed[i]
            if c != 'lua' and a[0].lower() == b'fcall' and a[1].decode().endswith('_' + name):
                cmds = []
                for c2, a2 in parsed[i + 1:en]:
                    if c2 != 'lua': break
                    cmds.append([x.decode('latin-1') for x in a2])
                return {'args': [x.decode('latin-1') for x in a], 'commands': cmds}
    calls = {'admit': find('replay', 'lease', 'admit'), 'complete': find('repeat', 'end', 'complete'),
             # The fresh paths (`probe.py cycle`): a new admission, the lease's start, the
             # completion of that run.
             'fresh': find('fresh', 'replay', 'admit'), 'start': find('lease', 'complete', 'start'),
             'done': find('complete', 'repeat', 'complete')}
    lib = R(port).call('FUNCTION', 'LIST', 'WITHCODE')
    own.call('SAVE'); own.send('SHUTDOWN', 'NOSAVE'); rs.wait()
    code = None
    for l in lib:
        d = dict(zip(l[0::2], l[1::2]))
        code = d[b'library_code'].decode('latin-1')
    open(os.path.join(out, 'library.lua'), 'w', encoding='latin-1').write(code)
    json.dump(calls, open(os.path.join(out, 'calls.json'), 'w'), indent=1)
    for k, v in calls.items(): print(k, len(v['args']) - 2, 'args', [c[0] for c in v['commands']], file=sys.stderr)

def lua_lit(s):
    return '"' + ''.join(c if 0x20 <= ord(c) < 0x7f and c not in '"\\' else '\\%03d' % ord(c) for c in s) + '"'

def bare(call, upto=None):
    cmds = call['commands'] if upto is None else call['commands'][:upto]
    return '#!lua\n' + ''.join('redis.pcall(%s)\n' % ', '.join(map(lua_lit, c)) for c in cmds) + 'return 0\n'

class CG:
    def __init__(self, out):
        self.port = free_port(); self.out = os.path.join(out, 'cg.out'); self.dumps = 0
        for f in os.listdir(out):
            if f.startswith('cg.out'): os.remove(os.path.join(out, f))
        self.p = subprocess.Popen(['valgrind', '--tool=callgrind', '--callgrind-out-file=' + self.out] + CALLGRIND_ARGS + [REDIS_SERVER, '--port', str(self.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', os.path.join(out, 'cap'), '--dbfilename', 'dump.rdb'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, 300)
        self.r = R(self.port)
    def ctl(self, flag):
        subprocess.run(['callgrind_control', flag, str(self.p.pid)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def window(self, fn):
        self.ctl('-z'); t = time.time(); fn(); self.ctl('-d'); secs = time.time() - t
        self.dumps += 1
        text = open('%s.%d' % (self.out, self.dumps)).read()
        ir = int(re.search(r'^summary: (\d+)', text, re.M).group(1))
        return ir, secs
    def send_all(self, cmd, n):
        done = 0
        while done < n:
            b = min(50, n - done)
            for _ in range(b): self.r.send(*cmd)
            for _ in range(b):
                x = self.r.read()
                if isinstance(x, Exception): raise x
            done += b
    def replay(self, cmd, n, warm=0):
        """Instructions per call of cmd sent n times, after `warm` sends outside the window."""
        self.send_all(cmd, warm)
        ir, secs = self.window(lambda: self.send_all(cmd, n))
        return ir / n, secs
    def idle(self, secs=2.0):
        ir, s = self.window(lambda: time.sleep(secs)); return ir / s
    def stop(self):
        try: self.r.send('SHUTDOWN', 'NOSAVE'); self.r.read()
        except Exception: pass
        self.p.wait()

def ran_now(cg, call):
    """The commands `call` runs when sent once more on this server (MONITOR): not always those
    of its step, which the later steps change (the replayed admission's mapping leaves its
    bucket for the string key when the execution completes: each replay runs a GET more)."""
    mon = R(cg.port); mon.send('MONITOR'); assert mon.f.readline().startswith(b'+OK')
    cg.r.call('ECHO', 'cost-mark:now'); cg.r.send(*call['args']); cg.r.read()
    cg.r.call('ECHO', 'cost-mark:now-end')
    lines = []
    while not lines or 'cost-mark:now-end' not in lines[-1]:
        lines.append(mon.f.readline().decode('latin-1').rstrip('\r\n'))
    mon.s.close()
    return [[x.decode('latin-1') for x in a] for c, a in filter(None, map(parse_monitor, lines)) if c == 'lua']

# Replays of each call sent before its counted ones in `measure`, outside the window (see the
# docstring): 50 left several figures 0.3-1.2 k above those of 500 or 2,000, which agree.
WARM = 500

def measure(out, variants, n, which):
    calls = json.load(open(os.path.join(out, 'calls.json')))
    cg = CG(out)
    try:
        rate = cg.idle(2.0)
        res = {}
        for path in which:
            call = calls[path]
            if variants:
                cg.r.call('FUNCTION', 'LOAD', 'REPLACE', open(variants[-1], encoding='latin-1').read())
                call = dict(call, commands=ran_now(cg, call))
                print('%-9s runs %s' % (path, [c[0] for c in call['commands']]), flush=True)
            sha = cg.r.call('SCRIPT', 'LOAD', bare(call)).decode()
            bcmd = ['EVALSHA', sha] + call['args'][2:]
            def run(cmd):
                ir, secs = cg.replay(cmd, n, WARM)
                return round(ir - rate * secs / n)
            b = run(bcmd)
            res[(path, 'bare')] = b
            print('%-9s %-28s %8d' % (path, 'bare', b), flush=True)
            for k in range(len(call['commands'])):
                sk = cg.r.call('SCRIPT', 'LOAD', bare(call, k)).decode()
                x = run(['EVALSHA', sk] + call['args'][2:])
                print('%-9s %-28s %8d' % (path, 'bare:%d' % k, x), flush=True)
            for v in variants:
                name = os.path.basename(v)
                if not name.startswith(path[0]): continue
                cg.r.call('FUNCTION', 'LOAD', 'REPLACE', open(v, encoding='latin-1').read())
                x = run(call['args'])
                res[(path, name)] = x
                print('%-9s %-28s %8d  overhead %8d' % (path, name, x, x - b), flush=True)
    finally:
        cg.stop()

# (name, path, the line a probe returns before; or the reply replaced by 0)
PROBES = [
    ('a0_empty', 'admit', 'P = ARGV[1]'),
    # admit.lua runs begin_call() itself, past the dedup lookup (round five): a replay never
    # reaches it, so the guard's part ends where the per-call part begins.
    ('a1_guard', 'admit', '-- Per call'),
    ('a3_resets', 'admit', 'local n = COUNTS[ARGV[6]]'),
    ('a4_checks', 'admit', 'if n == 1 then'),
    # Inside admit_one (a replay): its entry (the pcall), then past the dedup lookup.
    ('a41_pcall', 'admit', '  local dedup, dedup_hash, fingerprint = ARGV[a + 6]'),
    ('a42_holder', 'admit', '    if holder then'),
    ('a45_flush', 'admit', 'flush_trends()'),
    ('a5_noreply', 'admit', None),
    ('a9_full', 'admit', ''),
    ('c0_empty', 'complete', 'P = ARGV[1]'),
    ('c1_guard', 'complete', 'begin_call()'),
    ('c2_begin', 'complete', '-- Per call'),
    ('c3_top', 'complete', 'local first = nil'),
    # A repeat alone in its call is answered from its row (round two): the parts up to there.
    ('c4_quiet', 'complete', '  if what then return what end'),
    ('c9_full', 'complete', ''),
]

def probes(out):
    lib = open(os.path.join(out, 'library.lua'), encoding='latin-1').read().split('\n')
    os.makedirs(os.path.join(out, 'probes'), exist_ok=True)
    for name, stem, before in PROBES:
        s = [i for i, l in enumerate(lib) if l.startswith('redis.register_function') and "_%s'" % stem in l][0]
        e = [i for i in range(s + 1, len(lib)) if lib[i] == 'end }'][0]
        text = list(lib)
        if before is None:
            at = [i for i in range(s, e) if text[i].strip() == 'return replies'][-1]
            text[at] = 'return 0'
        elif before:
            # From the block that makes the operation's helpers once (admit_one()), if any.
            s0 = max([i for i in range(s) if lib[i] == 'do'], default=s)
            at = [i for i in range(s0, e) if text[i].startswith(before)][0]
            text.insert(at, 'do return 0 end')
        open(os.path.join(out, 'probes', name), 'w', encoding='latin-1').write('\n'.join(text))

# ---- The fresh paths: a cycle of a new admission, its start (the lease's call) and its
# completion, each call made new per execution (its id, dedup key and digest replaced).

def split_call(call):
    a = call['args']; nk = int(a[2])
    return a[3:3 + nk], a[3 + nk:]

def fresh_subs(calls, x):
    """The replacements that make execution number x of the captured cycle: a new id (its
    last 12 hex digits, so later ids sort later and the queue pops them in order), dedup key
    and digest (its first two digits kept: the same dedup bucket)."""
    _, argv = split_call(calls['fresh'])
    oid, okey, odig = argv[9], argv[14], argv[15]
    nid, ndig = oid[:-12] + '%012x' % x, odig[:2] + '%030x' % x
    return [(oid, nid), (odig, ndig), (odig[2:], ndig[2:]), (okey, 'cycle-%d' % x)]

def subst(strs, subs):
    out = []
    for s in strs:
        for a, b in subs: s = s.replace(a, b)
        out.append(s)
    return out

PATHS = ['fresh', 'start', 'done']

def cycle(out, n, libs):
    """Per library (a file, or 'bare': scripts of the recorded commands alone): n executions
    admitted, then started, then completed, each path in a window of its own (a backlog),
    then n more as n cycles admit-start-complete in one window (the end-to-end run at a low
    rate: the tenant enters and leaves the runnable set each time). Instructions per call,
    Redis's idle rate taken out."""
    calls = json.load(open(os.path.join(out, 'calls.json')))
    for lib in libs:
      # A redis-server of its own per library, from the capture's data: each starts from the
      # same keys (a server kept across libraries grows its sets and Lua heap between them).
      cg = CG(out)
      base = 1
      try:
            rate = cg.idle(2.0)
            def cmds(path, x):
                subs = fresh_subs(calls, x)
                call = calls[path]
                if lib == 'bare':
                    text = bare({'commands': [subst(c, subs) for c in call['commands']]})
                    sha = cg.r.call('SCRIPT', 'LOAD', text).decode()
                    return ['EVALSHA', sha] + subst(call['args'][2:], subs)
                return subst(call['args'], subs)
            if lib != 'bare':
                cg.r.call('FUNCTION', 'LOAD', 'REPLACE', open(lib, encoding='latin-1').read())
            name = os.path.basename(lib)
            row = []
            batches = {p: [cmds(p, base + j) for j in range(n)] for p in PATHS}
            for p in PATHS:
                ir, secs = cg.window(lambda: run_all(cg, batches[p], p, lib != 'bare'))
                row.append(round((ir - rate * secs) / n))
            base += n
            inter = []
            for j in range(n):
                inter.extend(cmds(p, base + j) for p in PATHS)
            ir, secs = cg.window(lambda: run_all(cg, inter, None, lib != 'bare'))
            row.append(round((ir - rate * secs) / n))
            base += n
            print('%-22s fresh %8d  start %8d  done %8d  | cycle %8d' % (name, *row), flush=True)
      finally:
        cg.stop()

def run_all(cg, cmds, path, check):
    """Sends cmds pipelined 50 at a time; with check, each answer must be the path's success
    (a new admission, one run started, a completion done)."""
    want = {'fresh': b'new', 'start': b'bench-t0', 'done': b'done'}
    done = 0
    while done < len(cmds):
        b = cmds[done:done + 50]
        for c in b: cg.r.send(*c)
        for i, c in enumerate(b):
            x = cg.r.read()
            if isinstance(x, Exception): raise x
            if path == 'x': continue
            p = path or PATHS[(done + i) % 3]
            if check and want[p] not in repr(x).encode():
                raise RuntimeError('%s answered %r' % (p, x))
        done += len(b)

# ---- Grouped admissions: one call of admit.lua carrying many (the group commit in a backlog).

def capture_group(sluice, out, n_req=64):
    """A redis-server and `sluice serve`: Redis's writes paused (CLIENT PAUSE, which holds
    scripts too) while n_req admissions with a dedup key each are sent at once, so that they
    queue in the group commit and go in one or two calls; the largest admit call is kept
    (group.json) with the library it ran (group-library.lua)."""
    port, base, rs, sv = serve(sluice, os.path.join(out, 'gcap'))
    h = {'Authorization': 'Bearer ' + TOKEN, 'X-Tenant-Id': 'bench-t0', 'Content-Type': 'application/json'}
    def post(i):
        hh = dict(h, **{'Idempotency-Key': 'grp-%d' % i})
        return http('POST', base + '/api/executions', json.dumps({'flow_id': 'demo.echo', 'params': {'n': i, 'p': 'x' * 14}}), hh)[0]
    assert post(-1) == 201   # the tenant's first admission: its cfg and registries exist
    lines, th = record(port)
    own = R(port)
    own.call('CLIENT', 'PAUSE', '1500', 'WRITE')
    res = [None] * n_req
    ts = [threading.Thread(target=lambda i=i: res.__setitem__(i, post(i))) for i in range(n_req)]
    for t in ts: t.start()
    for t in ts: t.join(60)
    own.call('ECHO', 'cost-mark:end')
    th.join(30)
    print('statuses', sorted(set(res)), file=sys.stderr)
    lib = R(port).call('FUNCTION', 'LIST', 'WITHCODE')
    sv.terminate(); sv.wait()
    own.send('SHUTDOWN', 'NOSAVE'); rs.wait()
    best = None
    for c, a in filter(None, map(parse_monitor, lines)):
        if c != 'lua' and a[0].lower() == b'fcall' and a[1].decode().endswith('_admit'):
            nk = int(a[2]); n = int(a[3 + nk + 5])
            if not best or n > best[0]: best = (n, [x.decode('latin-1') for x in a])
    code = [dict(zip(l[0::2], l[1::2]))[b'library_code'].decode('latin-1') for l in lib][0]
    open(os.path.join(out, 'group-library.lua'), 'w', encoding='latin-1').write(code)
    json.dump({'n': best[0], 'args': best[1]}, open(os.path.join(out, 'group.json'), 'w'))
    print('largest admit call: %d admissions, %d keys, %d values' % (best[0], int(best[1][2]), len(best[1]) - 3 - int(best[1][2])), file=sys.stderr)

def group_calls(g, r0, reps):
    """reps copies of the grouped call, each admission with a new id, dedup key and digest
    (the digest's first two digits kept: the same bucket)."""
    a = g['args']; nk = int(a[2]); n = g['n']
    argv = a[3 + nk:]; per = (len(argv) - 8) // n
    out = []
    for r in range(r0, r0 + reps):
        subs = []
        for i in range(n):
            b = 8 + per * i
            oid, okey, odig = argv[b + 1], argv[b + 6], argv[b + 7]
            x = r * 128 + i
            ndig = odig[:2] + '%030x' % x
            subs += [(oid, oid[:-12] + '%012x' % x), (odig, ndig), (odig[2:], ndig[2:]), (okey, 'g-%d' % x)]
        out.append(subst(a, subs))
    return out

def group(out, reps, warm=20):
    """Instructions per admission of the captured grouped call, replayed `reps` times with new
    admissions each time (after `warm` unmeasured), on a redis-server of its own started from
    nothing but the library and the tenant's first admission."""
    g = json.load(open(os.path.join(out, 'group.json')))
    os.makedirs(os.path.join(out, 'cap'), exist_ok=True)   # CG's --dir: no dump there, empty
    cg = CG(out)
    try:
        cg.r.call('FUNCTION', 'LOAD', 'REPLACE', open(os.path.join(out, 'group-library.lua'), encoding='latin-1').read())
        rate = cg.idle(2.0)
        calls = group_calls(g, 1, warm + reps)
        run_all(cg, calls[:warm], 'x', False)
        ir, secs = cg.window(lambda: run_all(cg, calls[warm:], 'x', False))
        last = cg.r.call(*group_calls(g, 10 ** 6, 1)[0])
        # (A call of many answers a new admission as the string 'new:...' since round seven.)
        new = sum(1 for e in last if (e[0] == b'new' if isinstance(e, list) else e.startswith(b'new:')))
        print('group of %d: %d instructions per admission (%d per call); a check call answered %d new' % (g['n'], round((ir - rate * secs) / (reps * g['n'])), round((ir - rate * secs) / reps), new), flush=True)
    finally:
        cg.stop()

# ---- Grouped completions: one call of complete.lua carrying n worker reports.

def complete_group(out, reps, libs):
    """Per library (a file of a build whose complete.lua takes the captured call's arguments):
    one call of n = 1, 8, 32 worker reports (no tenant named, no chain) of runs that are not
    current, each answered 'stale' after the same commands in every build (its row's HMGET, the
    `fenced` counter), replayed `reps` times on a fresh server: instructions per call. What
    differs between builds is the Lua around the commands and the answer's shape."""
    tmpl = json.load(open(os.path.join(out, 'calls.json')))['done']['args']
    os.makedirs(os.path.join(out, 'cap'), exist_ok=True)
    shard_keys, prefix, common = tmpl[3:10], tmpl[12], tmpl[12:20]
    def call(name, n):
        keys, args = list(shard_keys), list(common) + [str(n)]
        for i in range(n):
            fid = '%032x' % (0xabc000 + i)
            keys += [prefix + 'exec:' + fid, prefix + 'adopted:w']
            args += [fid, '1', 'w', 'completed', '{}', '', '', '', '0', '30000', '0', '']
        return ['FCALL', name, str(len(keys))] + keys + args
    for lib in libs:
        code = open(lib, encoding='latin-1').read()
        name = code.split('name=')[1].split()[0] + '_complete'
        cg = CG(out)
        try:
            cg.r.call('FUNCTION', 'LOAD', 'REPLACE', code)
            rate = cg.idle(2.0)
            row = []
            for n in (1, 8, 32):
                c = call(name, n)
                for _ in range(200): cg.r.call(*c)   # warm-up
                per, secs = cg.replay(c, reps)
                row.append(round(per - rate * secs / reps))
            print('%-40s n=1 %8d  n=8 %8d  n=32 %8d' % (lib, *row), flush=True)
        finally:
            cg.stop()

def start_group(out, reps, libs, n=16, warm=2):
    """Per library (a file of a build whose admit.lua and start.lua take the captured calls'
    arguments): a worker's grouped start, `sluice worker`'s shape (no `only` tenant, a call of
    as many runs as it has free slots): (warm + reps) * n fresh admissions of the capture's
    tenant first, then `warm` calls of n starts unmeasured and `reps` in one window, each
    answering n started runs; instructions per run and per call, Redis's idle rate taken out
    (bench/README.md, "Round eight: the start's Lua", measured it by hand)."""
    calls = json.load(open(os.path.join(out, 'calls.json')))
    keys, argv = split_call(calls['start'])
    # ARGV[7] the count; ARGV[12..], the pull lease's `only` tenants, dropped.
    argv = argv[:11]
    argv[6] = str(n)
    for lib in libs:
        code = open(lib, encoding='latin-1').read()
        name = code.split('name=')[1].split()[0]
        cg = CG(out)
        try:
            cg.r.call('FUNCTION', 'LOAD', 'REPLACE', code)
            rate = cg.idle(2.0)
            fresh = []
            for x in range(1, (warm + reps) * n + 1):
                c = subst(calls['fresh']['args'], fresh_subs(calls, x))
                fresh.append([c[0], name + '_admit'] + c[2:])
            run_all(cg, fresh, 'fresh', True)
            start = ['FCALL', name + '_start', str(len(keys))] + keys + argv
            def go(k):
                for _ in range(k):
                    started = cg.r.call(*start)[1]
                    if len(started) != n:
                        raise RuntimeError('a start of %d answered %d runs' % (n, len(started)))
            go(warm)
            ir, secs = cg.window(lambda: go(reps))
            per_call = (ir - rate * secs) / reps
            print('%-40s start of %d: %8d per run  %9d per call' % (lib, n, round(per_call / n), round(per_call)), flush=True)
        finally:
            cg.stop()

def chain_backlog(out, reps, libs, n=16):
    """Per library: a busy `sluice worker`'s completions in a backlog, each chaining the next
    run on the slot it frees (bench/README.md, "Round ten: the completion's and start's Lua").
    2 * reps + n fresh admissions of the capture's tenant, reps runs started by worker calls of n
    (no `only`, numbered), then in one window reps completions of those runs, each a worker's
    report (no tenant named, numbered) with chain 1, each checked to start one run: the
    tenant stays runnable and first in the set throughout. Instructions per completion,
    Redis's idle rate taken out."""
    calls = json.load(open(os.path.join(out, 'calls.json')))
    skeys, sargv = split_call(calls['start'])
    sargv = sargv[:11]
    sargv[6], sargv[9] = str(n), '1'
    dkeys, dargv = split_call(calls['done'])
    prefix = dargv[0]
    for lib in libs:
        code = open(lib, encoding='latin-1').read()
        name = code.split('name=')[1].split()[0]
        cg = CG(out)
        try:
            cg.r.call('FUNCTION', 'LOAD', 'REPLACE', code)
            rate = cg.idle(2.0)
            fresh = []
            # (The starts take up to n - 1 more than reps: each completion must find one.)
            for x in range(1, 2 * reps + n + 1):
                c = subst(calls['fresh']['args'], fresh_subs(calls, x))
                fresh.append([c[0], name + '_admit'] + c[2:])
            run_all(cg, fresh, 'fresh', True)
            runs = []
            start = ['FCALL', name + '_start', str(len(skeys))] + skeys + sargv
            while len(runs) < reps:
                for line in cg.r.call(*start)[1]:
                    f = line.split(b'\n')
                    runs.append((f[0].decode(), f[1].decode()))
            dones = []
            for rid, fence in runs[:reps]:
                keys = list(dkeys)
                keys[7] = prefix + 'exec:' + rid
                argv = list(dargv)
                argv[9], argv[10] = rid, fence
                argv[17], argv[18], argv[19], argv[20] = '1', '30000', '1', ''
                dones.append(['FCALL', name + '_complete', str(len(keys))] + keys + argv)
            def go():
                for c in dones:
                    x = cg.r.call(*c)[0]
                    if x[0] != b'done' or len(x[2]) != 1:
                        raise RuntimeError('a chained completion answered %r' % (x,))
            ir, secs = cg.window(go)
            per = round((ir - rate * secs) / reps)
            print('%-40s chained completion: %8d' % (lib, per), flush=True)
        finally:
            cg.stop()

# ---- Batch admissions: the calls of `admit.lua` one `POST /api/executions/batch` makes.

def batch_body(tenant, size, first):
    """A batch of `size` items of one tenant, a unique dedup key and ~30-byte params each (the
    cost measurement's shape, bench/README.md "Cost per execution")."""
    return json.dumps({'items': [{'flow_id': 'demo.echo', 'params': {'n': i, 'p': 'x' * 14},
                                  'dedup_key': 'b-%s-%d' % (tenant, i)}
                                 for i in range(first, first + size)]})

def post_batches(base, tenants, size, first):
    """One batch of `size` items per tenant, all tenants at once (one thread each, as the
    benchmark's batch phase sends them); every item must answer 201."""
    res = {}
    def one(t):
        h = {'Authorization': 'Bearer ' + TOKEN, 'X-Tenant-Id': t, 'Content-Type': 'application/json'}
        st, body = http('POST', base + '/api/executions/batch', batch_body(t, size, first), h)
        res[t] = (st, [r['status'] for r in json.loads(body)['results']] if st == 200 else body)
    ts = [threading.Thread(target=one, args=(t,)) for t in tenants]
    for t in ts: t.start()
    for t in ts: t.join(300)
    for t, (st, r) in res.items():
        if st != 200 or any(x != 201 for x in r):
            raise RuntimeError('batch of %s answered %s %r' % (t, st, r if st != 200 else sorted(set(r))))

def batch_tenants(k):
    return ['bench-t%d' % i for i in range(k)]

def capture_batch(sluice, out, size, k):
    """A redis-server and `sluice serve`: each of k tenants admits one execution first (its cfg
    and registries exist), then one batch of `size` items per tenant, all at once, under
    MONITOR: every `admit.lua` call they made, in order (batch-<size>x<k>.json), and the
    library (batch-library.lua)."""
    port, base, rs, sv = serve(sluice, os.path.join(out, 'bcap'))
    tenants = batch_tenants(k)
    post_batches(base, tenants, 1, 10 ** 7)
    lines, th = record(port)
    own = R(port)
    post_batches(base, tenants, size, 0)
    own.call('ECHO', 'cost-mark:end')
    th.join(60)
    lib = R(port).call('FUNCTION', 'LIST', 'WITHCODE')
    sv.terminate(); sv.wait()
    own.send('SHUTDOWN', 'NOSAVE'); rs.wait()
    calls, cmds = [], {}
    for c, a in filter(None, map(parse_monitor, lines)):
        if c == 'lua':
            n = a[0].decode().lower(); cmds[n] = cmds.get(n, 0) + 1
        elif a[0].lower() == b'fcall' and a[1].decode().endswith('_admit'):
            calls.append([x.decode('latin-1') for x in a])
    code = [dict(zip(l[0::2], l[1::2]))[b'library_code'].decode('latin-1') for l in lib][0]
    open(os.path.join(out, 'batch-library.lua'), 'w', encoding='latin-1').write(code)
    name = os.path.join(out, 'batch-%dx%d.json' % (size, k))
    json.dump({'size': size, 'tenants': k, 'calls': calls, 'commands': cmds}, open(name, 'w'))
    items = sum(int(c[3 + int(c[2]) + 5]) for c in calls)
    print('%s: %d admit calls for %d items (%.1f a call); in scripts per item: %s' % (name, len(calls), items, items / len(calls),
          ', '.join('%s %.2f' % (n, v / items) for n, v in sorted(cmds.items(), key=lambda x: -x[1]))), file=sys.stderr)

def renew_call(a, r, at):
    """Captured `admit.lua` call `a` with every admission made new for replay round r: a new id
    (its last 12 hex digits), dedup key and digest (first two hex digits kept: the same
    bucket), in the key and the bucket's field too; `at` numbers the round's admissions so far:
    (the call, the number after its last)."""
    a = list(a); nk = int(a[2]); keys0, argv0 = 3, 3 + nk
    n = int(a[argv0 + 5]); k = keys0 + 1
    # Values per admission: 17 in builds before round nine's `schedule`, 16 since.
    per = (len(a) - argv0 - 8) // n
    for i in range(n):
        b = argv0 + 8 + per * i
        oid, okey, odig = a[b + 1], a[b + 6], a[b + 7]
        x = r * 2 ** 20 + at + i
        if okey:
            ndig = odig[:2] + '%030x' % x
            a[b + 6], a[b + 7], a[b + per - 1] = 'r%d-%s' % (r, okey), ndig, ndig[2:]
            a[k + 2] = a[k + 2].replace(odig, ndig)
            k += 3
        else:
            k += 1
        a[b + 1] = oid[:-12] + '%012x' % x
    return a, at + n

def batch_replay(out, size, k, reps, lib=None, warm=2):
    """The captured batches' calls replayed `reps` times (after `warm` unmeasured), each time
    with new admissions, on a redis-server of its own under callgrind with the capture's
    library (or `lib`, a library of another build whose admit.lua takes the same arguments):
    instructions per item, Redis's idle rate taken out; commands per item
    by name (INFO commandstats over the counted replays); script calls per batch."""
    g = json.load(open(os.path.join(out, 'batch-%dx%d.json' % (size, k))))
    os.makedirs(os.path.join(out, 'cap'), exist_ok=True)
    cg = CG(out)
    try:
        code = open(lib or os.path.join(out, 'batch-library.lua'), encoding='latin-1').read()
        cg.r.call('FUNCTION', 'LOAD', 'REPLACE', code)
        # Another build's library names its functions apart: the captured calls go to its admit.
        name = code.split('name=')[1].split()[0] + '_admit'
        rate = cg.idle(2.0)
        def rnd(r):
            out, at = [], 0
            for c in g['calls']:
                c, at = renew_call(c, r, at); c[1] = name; out.append(c)
            return out
        for r in range(1, warm + 1): run_batch(cg, rnd(r))
        todo = [rnd(r) for r in range(warm + 1, warm + reps + 1)]
        cg.r.call('CONFIG', 'RESETSTAT')
        ir, secs = cg.window(lambda: [run_batch(cg, t) for t in todo])
        stats = cg.r.call('INFO', 'commandstats').decode()
        items = reps * sum(int(c[3 + int(c[2]) + 5]) for c in g['calls'])
        cmds = {}
        for m in re.finditer(r'^cmdstat_([^:]+):calls=(\d+)', stats, re.M):
            if m.group(1) not in ('info', 'config'): cmds[m.group(1)] = int(m.group(2)) / items
        per = (ir - rate * secs) / items
        print('batch %d x %d tenants (%s): %d instructions per item; %d calls per batch of %d; per item: %s' % (
            size, k, os.path.basename(lib) if lib else 'capture', round(per), len(g['calls']) // k, size,
            ', '.join('%s %.2f' % (n, v) for n, v in sorted(cmds.items(), key=lambda x: -x[1]))), flush=True)
    finally:
        cg.stop()

def batch_cpu(out, size, k, reps, lib=None, warm=2):
    """The same replay on a plain redis-server (no valgrind): Redis's CPU time (used_cpu_user
    + used_cpu_sys of INFO cpu) per item over `reps` rounds, the figure the instruction counts
    stand for (a busy machine inflates it: read it beside them, not alone)."""
    g = json.load(open(os.path.join(out, 'batch-%dx%d.json' % (size, k))))
    work = os.path.join(out, 'cpu'); os.makedirs(work, exist_ok=True)
    port = free_port()
    rs = subprocess.Popen(['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', work], stdout=subprocess.DEVNULL)
    try:
        wait_port(port)
        r = R(port)
        code = open(lib or os.path.join(out, 'batch-library.lua'), encoding='latin-1').read()
        r.call('FUNCTION', 'LOAD', 'REPLACE', code)
        name = code.split('name=')[1].split()[0] + '_admit'
        def rnd(x):
            calls, at = [], 0
            for c in g['calls']:
                c, at = renew_call(c, x, at); c[1] = name; calls.append(c)
            return calls
        class Plain: pass
        p = Plain(); p.r = r
        for x in range(1, warm + 1): run_batch(p, rnd(x))
        todo = [rnd(x) for x in range(warm + 1, warm + reps + 1)]
        def cpu():
            info = r.call('INFO', 'cpu').decode()
            return sum(float(re.search(r'^%s:([\d.]+)' % f, info, re.M).group(1)) for f in ('used_cpu_user', 'used_cpu_sys'))
        c0 = cpu()
        for t in todo: run_batch(p, t)
        items = reps * sum(int(c[3 + int(c[2]) + 5]) for c in g['calls'])
        print('batch %d x %d tenants (%s): %.2f us of Redis CPU per item over %d items' % (
            size, k, os.path.basename(lib) if lib else 'capture', (cpu() - c0) * 1e6 / items, items), flush=True)
    finally:
        R(port).send('SHUTDOWN', 'NOSAVE'); rs.wait()

def run_batch(cg, calls):
    """Sends one batch's calls in order, one at a time (as the batch task does), and checks
    that every admission answered 'new'."""
    for c in calls:
        x = cg.r.call(*c)
        bad = [e for e in x if not (e[0] == b'new' if isinstance(e, list) else e.startswith(b'new'))]
        if bad: raise RuntimeError('admit answered %r' % bad[:3])

def serve_batch(sluice, out, size, k, count, warm=2):
    """`sluice serve` under callgrind (--instr-atstart=no) on a plain redis-server: `warm`
    rounds of one batch of `size` per tenant (k tenants at once) uncounted, then `count`
    rounds counted: serve's instructions per item."""
    work = os.path.join(out, 'sbatch'); os.makedirs(work, exist_ok=True)
    for f in os.listdir(work): os.remove(os.path.join(work, f))
    port = free_port()
    rs = subprocess.Popen(['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', work], stdout=subprocess.DEVNULL)
    wait_port(port)
    hp = free_port(); cgo = os.path.join(work, 'serve.cg')
    env = dict(os.environ, SLUICE_ADMIN_TOKEN=TOKEN, RUST_LOG='warn', SLUICE_DEFAULT_MAX_BYTES='1000000000000', SLUICE_DEFAULT_MAX_RETAINED='1000000000000')
    sv = subprocess.Popen(['valgrind', '--tool=callgrind', '--instr-atstart=no', '--callgrind-out-file=' + cgo, sluice, 'serve', '--listen', '127.0.0.1:%d' % hp, '--redis-url', 'redis://127.0.0.1:%d' % port, '--sweep-interval-secs', '0', '--default-max-concurrent', '1000000', '--default-max-queued', '1000000', '--redis-timeout-ms', '5000', '--request-timeout-ms', '120000'], env=env, stdout=open(os.path.join(work, 'serve.log'), 'w'), stderr=subprocess.STDOUT)
    base = 'http://127.0.0.1:%d' % hp
    try:
        for _ in range(600):
            try:
                if http('GET', base + '/readyz')[0] == 200: break
            except Exception: pass
            time.sleep(0.2)
        tenants = batch_tenants(k)
        for r in range(warm): post_batches(base, tenants, size, 10 ** 7 + r * size)
        ctl = lambda *f: subprocess.run(['callgrind_control', *f, str(sv.pid)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        own = R(port); own.call('CONFIG', 'RESETSTAT')
        ctl('-i', 'on')
        for r in range(count): post_batches(base, tenants, size, r * size)
        ctl('-d')
        calls = int(re.search(r'^cmdstat_fcall:calls=(\d+)', own.call('INFO', 'commandstats').decode(), re.M).group(1))
        text = open(cgo + '.1').read()
        ir = int(re.search(r'^totals: (\d+)', text, re.M).group(1))
        items = count * size * k
        print('serve, batches of %d x %d tenants, %d rounds: %d instructions per item; %.1f script calls per batch' % (
            size, k, count, round(ir / items), calls / (count * k)), flush=True)
    finally:
        sv.terminate(); sv.wait(60)
        R(port).send('SHUTDOWN', 'NOSAVE'); rs.wait()

if __name__ == '__main__':
    os.makedirs(OUT, exist_ok=True)
    if sys.argv[1] == 'capture':
        capture(sys.argv[2], OUT)
    elif sys.argv[1] == 'probes':
        probes(OUT)
    elif sys.argv[1] == 'measure':
        d = os.path.join(OUT, 'probes')
        measure(OUT, [os.path.join(d, f) for f in sorted(os.listdir(d))], int(sys.argv[2]),
                ['admit', 'complete'])
    elif sys.argv[1] == 'capture-group':
        # probe.py capture-group target/release/sluice [requests]
        capture_group(sys.argv[2], OUT, int(sys.argv[3]) if len(sys.argv) > 3 else 64)
    elif sys.argv[1] == 'group':
        # probe.py group 100: the captured grouped call replayed 100 times
        group(OUT, int(sys.argv[2]))
    elif sys.argv[1] == 'complete-group':
        # probe.py complete-group 300 LIB...: grouped worker completions, per call
        complete_group(OUT, int(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1] == 'start-group':
        # probe.py start-group 20 LIB...: a worker's grouped start of 16, per run
        start_group(OUT, int(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1] == 'chain':
        os.makedirs(OUT, exist_ok=True)
        chain_backlog(OUT, int(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1] == 'capture-batch':
        # probe.py capture-batch target/release/sluice 1000 8: one batch of 1000 per tenant, 8 tenants
        capture_batch(sys.argv[2], OUT, int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == 'batch':
        # probe.py batch 1000 8 5 [LIB]: the captured batches replayed 5 times
        batch_replay(OUT, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None)
    elif sys.argv[1] == 'batch-cpu':
        # probe.py batch-cpu 1000 1 20 [LIB]: Redis CPU per item, no valgrind
        batch_cpu(OUT, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None)
    elif sys.argv[1] == 'serve-batch':
        # probe.py serve-batch target/release/sluice 1000 8 3: serve's instructions per item
        serve_batch(sys.argv[2], OUT, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == 'cycle':
        # probe.py cycle 300 bare target/overhead-probe/library.lua other-library.lua ...
        cycle(OUT, int(sys.argv[2]), sys.argv[3:])
