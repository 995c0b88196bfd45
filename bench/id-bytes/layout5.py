#!/usr/bin/env python3
"""Key layout 5, step 0: what each of its changes costs or saves per execution, measured on
real redis-servers with Redis's default encoding thresholds (docs/layout-5-plan.md on branch
layout5-plan, §3 step 0 and open questions 1-4; bench/README.md, "Layout 5, step 0: measured").

    python3 bench/id-bytes/layout5.py [COUNT]          # COUNT 100000 queued executions
    python3 bench/id-bytes/layout5.py 100000 q3        # only some questions: q1 q2 q3 q4

Each figure comes from a fresh redis-server of its own (a free loopback port, no persistence,
every encoding threshold Redis's default; `--enable-debug-command local` only so that
`DEBUG LISTPACK` can tell a row's exact listpack length; for the cluster figures a one-node
cluster holding every slot, as `CLUSTER=1 run.sh` does): fill5.lua writes 8 warm-up
executions, `used_memory` and measure5.lua's per-kind `MEMORY USAGE` sums are read, fill5.lua
writes COUNT more (batches of 10 000), both are read again, and the growth is divided by
COUNT: the cost benchmark's arithmetic (bench/sluice-bench/src/cost/bytes.rs). Every key's
`OBJECT ENCODING` is counted after the fill; a hash or sorted set that is not listpack is
printed as CONVERTED unless the variant expects it (the listing, one zset in both layouts, and
layout 4's single queue zset: skiplists past 128 members, "(expected)"). Questions:

  q1  the row alone: `fp` (8 bytes) added, `dh` as 16 bytes; MEMORY USAGE of every row and
      the listpack's own length (DEBUG LISTPACK of the first and the last row written)
  q2  the dedup mapping alone: the value `<id16><fp8>`, the bucket field as 15 bytes;
      retained mappings' `dd:` key names as 16 bytes
  q3  the queue alone: one zset against chunks of 128, 64 and 32 under a directory, full and
      after pops down to fractions of the chunk size (the merge floor of 32 included); one
      tenant 100 000 deep (its directory past 128 entries); chunks on a Redis whose
      `zset-max-listpack-entries` is 64 (the one non-default figure, open question 4)
  q4  the whole execution in layout 4 and in layout 5 (all of §1 together), standalone, on a
      cluster node and spread over 3 masters as the cost benchmark's cluster spreads its
      tenants, 30- and 200-byte params, against the 512 B target; and layout 5 on
      `zset-max-listpack-entries 64`

Python's standard library only; needs redis-server on PATH. Prints each run as it ends, then
the tables (markdown) bench/README.md quotes.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TENANTS = 8
WARM_UP = 8
BATCH = 10_000
TARGET = 512.0

# Layout 4 as main writes it (bench/id-bytes/fill.lua's shapes).
L4 = {}
# Layout 5, §1 together: binary ids (the listing member `A<flow>\0<id16>`), `dh` as 16 bytes
# and `fp` in the row, mapping value `<id16><fp8>`, the queue in chunks of 128.
L5 = {'id': 'bin', 'dh': 'bin', 'fp': '1', 'val': 'bin', 'lchar': 'A', 'queue': 'chunk',
      'chunk': '128'}


class Redis:
    """A RESP2 client of the few commands used here (binary-safe: binary ids in key names)."""

    def __init__(self, port):
        deadline = time.monotonic() + 10
        while True:
            try:
                self.sock = socket.create_connection(('127.0.0.1', port), timeout=600)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.f = self.sock.makefile('rb')

    def call(self, *args):
        out = [b'*%d\r\n' % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b'$%d\r\n%s\r\n' % (len(a), a))
        self.sock.sendall(b''.join(out))
        return self.read()

    def read(self):
        line = self.f.readline()
        if not line:
            raise ConnectionError('redis-server closed the connection')
        kind, rest = line[:1], line[1:-2]
        if kind == b'+':
            return rest.decode()
        if kind == b'-':
            raise RuntimeError(rest.decode())
        if kind == b':':
            return int(rest)
        if kind == b'$':
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if kind == b'*':
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f'unexpected reply {line!r}')


def free_port():
    """A loopback port free with its cluster bus port (+10 000, which must stay < 65 536)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(('127.0.0.1', 0))
            port = s.getsockname()[1]
        if port + 10_000 >= 65_536:
            continue
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', port + 10_000))
                return port
            except OSError:
                continue
    raise RuntimeError('no free port pair')


def used_memory(r):
    info = r.call('INFO', 'memory').decode()
    return int(re.search(r'^used_memory:(\d+)', info, re.M).group(1))


def parse_measure(lines):
    m = {'sum': {}, 'keys': {}, 'enc': {}, 'rowsize': {}, 'members': 0}
    for line in lines:
        w = line.decode().split()
        if w[0] == 'members':
            m['members'] = int(w[1])
        elif w[0] == 'sum':
            m['sum'][w[1]] = int(w[2])
            m['keys'][w[1]] = int(w[3])
        elif w[0] == 'enc':
            m['enc'][w[1]] = int(w[2])
        else:
            m['rowsize'][int(w[1])] = int(w[2])
    return m


KINDS = ['row', 'listing', 'queue', 'directory', 'dedup']


def growth(m0, k0, m1, k1, n):
    """Per execution: used_memory's growth, each kind's, and the rest (keyspace)."""
    g = {'total': (m1 - m0) / n}
    kinds = 0
    for kind in KINDS:
        d = k1['sum'].get(kind, 0) - k0['sum'].get(kind, 0)
        kinds += d
        if kind in k1['sum']:
            g[kind] = d / n
    g['keyspace'] = ((m1 - m0) - kinds) / n
    return g


def encodings(k, expect_skiplist=False):
    """'kind type/encoding ×keys' for every kind, CONVERTED where not listpack."""
    out = []
    for e, n in sorted(k['enc'].items()):
        kind, typ, enc = e.split('/')
        flag = ''
        if typ in ('hash', 'zset') and enc != 'listpack':
            # The listing stays one zset in both layouts (past 128 members, a skiplist).
            expected = kind == 'listing' or (expect_skiplist and kind == 'queue')
            flag = ' (expected)' if expected else ' CONVERTED'
        out.append(f'{kind} {typ}/{enc} ×{n}{flag}')
    return ', '.join(out)


def opts_text(opts):
    return ' '.join(f'{k}={v}' for k, v in sorted(opts.items()))


class Server:
    """A fresh redis-server on a free loopback port (a one-node cluster holding every slot
    when `cluster`), the scripts loaded and their first-call allocations made."""

    def __init__(self, cluster=False, config=()):
        self.work = tempfile.mkdtemp(prefix='layout5-')
        port = free_port()
        self.log_path = os.path.join(self.work, 'redis.log')
        args = ['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--save', '',
                '--appendonly', 'no', '--dir', self.work, '--enable-debug-command', 'local',
                *config]
        if cluster:
            args += ['--cluster-enabled', 'yes', '--cluster-config-file',
                     os.path.join(self.work, 'nodes.conf')]
        self.log = open(self.log_path, 'wb')
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self.r = Redis(port)
        except OSError:
            self.close()
            with open(self.log_path, 'rb') as f:
                sys.stderr.write(f.read().decode(errors='replace'))
            raise
        if cluster:
            self.r.call('CLUSTER', 'ADDSLOTSRANGE', 0, 16383)
            for _ in range(200):
                if b'cluster_state:ok' in self.r.call('CLUSTER', 'INFO'):
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError('the one-node cluster did not come up')
        self.sha = {}
        for name in ('fill5', 'measure5', 'shrink5'):
            with open(os.path.join(HERE, name + '.lua'), 'rb') as f:
                self.sha[name] = self.r.call('SCRIPT', 'LOAD', f.read())

    def script(self, name, *args):
        return self.r.call('EVALSHA', self.sha[name], 0, *args)

    def warm(self):
        """The server's lazy first-time allocations, made before the first read so that they
        are in no growth: INFO's, measure5.lua's first scan (about 148 KB: 1.5 B per execution
        at 100 000, which run.sh's order counts as keyspace) and the first pops' (about 25 KB,
        shrink5.lua 'warm'). Checked: after them every growth is the structures' own to the
        byte (the chunks' MEMORY USAGE sums move as used_memory does)."""
        used_memory(self.r)
        self.script('shrink5', 'warm')
        self.script('measure5')

    def read(self):
        """used_memory, then measure5.lua (read in this order: the scan comes after)."""
        m = used_memory(self.r)
        return m, parse_measure(self.script('measure5'))

    def fill(self, count, text):
        """Executions WARM_UP .. WARM_UP + count - 1; the last row key written."""
        at, last = WARM_UP, None
        while at < count + WARM_UP:
            n = min(BATCH, count + WARM_UP - at)
            _, key = self.script('fill5', at, n, text)
            last = key or last
            at += n
        return last

    def shutdown(self):
        """Stops the server; what it printed (DEBUG LISTPACK writes on its stdout)."""
        try:
            self.r.call('SHUTDOWN', 'NOSAVE')
        except (ConnectionError, OSError):
            pass
        self.proc.wait(timeout=60)
        self.log.close()
        with open(self.log_path, 'rb') as f:
            return f.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self.log.close()
        subprocess.run(['rm', '-rf', self.work], check=False)


def run(label, opts, count, cluster=False, shrink=(), lp_samples=False, config=()):
    """One fresh redis-server: warm-up, fill, the reads; then each shrink level in turn.
    `config`: redis-server options beyond the defaults (only where a row says so)."""
    result = {'label': label, 'opts': opts, 'count': count, 'cluster': cluster,
              'config': ' '.join(config), 'levels': []}
    s = Server(cluster, config)
    try:
        text = opts_text(opts)
        first, _ = s.script('fill5', 0, WARM_UP, text)
        s.warm()
        m0, k0 = s.read()
        last = s.fill(count, text)
        m1, k1 = s.read()
        result.update(g=growth(m0, k0, m1, k1, count), k=k1,
                      enc=encodings(k1, expect_skiplist=opts.get('queue', 'zset') == 'zset'))
        sampled = 0
        if lp_samples and first:
            for key in (first, last):
                if s.r.call('OBJECT', 'ENCODING', key) == b'listpack':
                    s.r.call('DEBUG', 'LISTPACK', key)
                    sampled += 1
        for keep in shrink:
            left = s.script('shrink5', opts.get('tenants', TENANTS), keep)
            m2, k2 = s.read()
            new = k2['members'] - k0['members']
            result['levels'].append({'keep': keep, 'left': left,
                                     'g': growth(m0, k0, m2, k2, new), 'k': k2,
                                     'enc': encodings(k2)})
        # DEBUG LISTPACK prints on the server's stdout, flushed at exit: one header per call.
        printed = s.shutdown()
        totals = [int(x) for x in re.findall(rb'\{total bytes (\d+)\}', printed)]
        result['lp_bytes'] = totals[:sampled]
    finally:
        s.close()
    report(result)
    return result


def run_spread(label, opts, count, groups):
    """The shard's tenants spread over cluster masters as the cost benchmark's 3-master
    cluster spreads its 8 tenants (`groups`: each master's tenants; one node holding every
    slot stands for each master): the same fill, each node writing only its tenants'
    executions, the growths summed over the nodes. What this adds to the one-node figure is
    each node's main dictionary sized for its share of the keys (a power of two each)."""
    servers = []
    result = {'label': label, 'opts': opts, 'count': count, 'cluster': True,
              'config': f'{len(groups)} masters, tenants ' + ' | '.join(
                  ','.join(map(str, g)) for g in groups), 'levels': []}
    try:
        reads = []
        for g in groups:
            s = Server(cluster=True)
            servers.append(s)
            text = opts_text({**opts, 'only': ','.join(map(str, g))})
            s.script('fill5', 0, WARM_UP, text)
            s.warm()
            m0, k0 = s.read()
            s.fill(count, text)
            m1, k1 = s.read()
            reads.append((m0, k0, m1, k1))
        m0, m1 = sum(rd[0] for rd in reads), sum(rd[2] for rd in reads)
        merged = []
        for i in (1, 3):
            k = {'sum': {}, 'enc': {}, 'rowsize': {}, 'members': 0}
            for rd in reads:
                for part in ('sum', 'enc', 'rowsize'):
                    for key, v in rd[i][part].items():
                        k[part][key] = k[part].get(key, 0) + v
            merged.append(k)
        result.update(g=growth(m0, merged[0], m1, merged[1], count), k=merged[1],
                      enc=encodings(merged[1], expect_skiplist=opts.get('queue', 'zset') == 'zset'))
    finally:
        for s in servers:
            s.close()
    report(result)
    return result


def fmt(x):
    return f'{x:.1f}'


def kinds_text(g):
    parts = [f'{k} {fmt(g[k])}' for k in KINDS + ['keyspace'] if k in g]
    return ', '.join(parts)


def report(res):
    g = res['g']
    where = 'cluster node' if res['cluster'] else 'standalone'
    if res['config']:
        where = res['config'] if 'masters' in res['config'] else where + ', ' + res['config']
    print(f"== {res['label']} [{opts_text(res['opts']) or 'layout 4'}; {where}; "
          f"{res['count']}]: {fmt(g['total'])} B per execution ({kinds_text(g)})")
    print(f"   encodings: {res['enc']}")
    if res['k']['rowsize']:
        sizes = ', '.join(f'{s} B ×{n}' for s, n in sorted(res['k']['rowsize'].items()))
        print(f'   rows by MEMORY USAGE: {sizes}')
    if res.get('lp_bytes'):
        print(f"   row listpack length (first, last row): {res['lp_bytes']}")
    for lv in res['levels']:
        print(f"   chunks cut to ≤ {lv['keep']}: {lv['left']} left, "
              f"{fmt(lv['g']['total'])} B per queued execution ({kinds_text(lv['g'])}); "
              f"{lv['enc']}")
    sys.stdout.flush()


def row_sizes(res):
    return ', '.join(f'{s} ×{n}' for s, n in sorted(res['k']['rowsize'].items()))


def q1(count):
    rows = {'parts': 'row'}
    variants = [
        ('layout 4: hex id, `dh` hex', {}),
        ('binary id, `dh` hex', {'id': 'bin'}),
        ('binary id, `dh` 16 B', {'id': 'bin', 'dh': 'bin'}),
        ('binary id, `dh` hex, + `fp` 8 B', {'id': 'bin', 'fp': '1'}),
        ('**binary id, `dh` 16 B, + `fp` 8 B** (plan)', {'id': 'bin', 'dh': 'bin', 'fp': '1'}),
    ]
    out = []
    for params in ('30', '200'):
        for label, o in variants:
            res = run(f'q1 {label}, {params} B params', {**rows, **o, 'params': params}, count,
                      lp_samples=True)
            out.append((f'{label}', params, 'queued', res))
    completed = max(count // 5, 1)
    for label, o in variants[2:5:2]:
        res = run(f'q1 {label}, completed', {**rows, **o, 'state': 'completed'}, completed,
                  lp_samples=True)
        out.append((label, '30', f'retained completed ({completed})', res))
    print('\n| row | params | state | MEMORY USAGE per row (B × rows) | listpack length, '
          'first and last row (B) | row B per execution | encoding |')
    print('|---|---:|---|---|---|---:|---|')
    for label, params, state, res in out:
        lp = ', '.join(map(str, res.get('lp_bytes') or [])) or '(hashtable)'
        print(f"| {label} | {params} | {state} | {row_sizes(res)} | {lp} | "
              f"{fmt(res['g']['row'])} | {res['enc']} |")


def q2(count):
    variants = [
        ('layout 4: value `<hex id>:<16 hex fp>` (49 B), field 30 hex', {}),
        ('value `<id16><fp8>` (24 B), field 30 hex (plan)', {'id': 'bin', 'val': 'bin'}),
        ('**value `<id16><fp8>`, field 15 B**', {'id': 'bin', 'val': 'bin', 'field': 'bin'}),
    ]
    out = []
    for label, o in variants:
        res = run(f'q2 {label}', {'parts': 'dedup', **o}, count)
        out.append((label, 'live mapping (bucket field)', count, res))
    completed = max(count // 5, 1)
    for label, o in [('value `<id16><fp8>`, key `...:dd:<32 hex>`', {}),
                     ('**value `<id16><fp8>`, key `...:dd:<16 B>`**', {'ddkey': 'bin'})]:
        res = run(f'q2 {label}', {'parts': 'dedup', 'id': 'bin', 'val': 'bin',
                                  'state': 'completed', **o}, completed)
        out.append((label, 'retained mapping (string key, TTL)', completed, res))
    print('\n| mapping | form | executions | dedup B per execution | used_memory B per '
          'execution | keyspace | encodings |')
    print('|---|---|---:|---:|---:|---:|---|')
    for label, form, n, res in out:
        g = res['g']
        print(f"| {label} | {form} | {n} | {fmt(g['dedup'])} | {fmt(g['total'])} | "
              f"{fmt(g['keyspace'])} | {res['enc']} |")


def q3(count):
    q = {'parts': 'queue'}
    out = []
    out.append(('one zset, hex members (layout 4)', run('q3 one zset, hex', q, count)))
    out.append(('one zset, 16 B members', run('q3 one zset, binary', {**q, 'id': 'bin'}, count)))
    for size, keeps in ((128, (96, 64, 32)), (64, (32, 16)), (32, (16, 8))):
        res = run(f'q3 chunks of {size}', {**q, 'id': 'bin', 'queue': 'chunk',
                                           'chunk': str(size)}, count, shrink=keeps)
        out.append((f'chunks of ≤ {size}', res))
    # One tenant 100 000 deep: 782 chunks, past the directory's own 128 (a skiplist then).
    res = run('q3 chunks of 128, one tenant', {**q, 'id': 'bin', 'queue': 'chunk',
                                               'tenants': '1'}, count, shrink=(32,))
    out.append(('chunks of ≤ 128, **one tenant** (the directory past 128 entries)', res))
    # Open question 4: a Redis whose zset-max-listpack-entries is below the chunk size.
    res = run('q3 chunks of 128, threshold 64', {**q, 'id': 'bin', 'queue': 'chunk'}, count,
              config=('--zset-max-listpack-entries', '64'))
    out.append(('chunks of ≤ 128 on **`zset-max-listpack-entries 64`** (not the default)', res))
    print('\n| queue | members per chunk | queued | B per queued execution (used_memory) | '
          'chunks | directory | keyspace | encodings |')
    print('|---|---:|---:|---:|---:|---:|---:|---|')
    for label, res in out:
        g = res['g']
        full = res['opts'].get('chunk', '128') if res['opts'].get('queue') == 'chunk' else '—'
        print(f"| {label} | {full} (full) | {res['count']} | **{fmt(g['total'])}** | "
              f"{fmt(g['queue'])} | {fmt(g.get('directory', 0))} | {fmt(g['keyspace'])} | "
              f"{res['enc']} |")
        for lv in res['levels']:
            g = lv['g']
            print(f"| {label}, after pops | {lv['keep']} | {lv['left'] - WARM_UP} | "
                  f"**{fmt(g['total'])}** | {fmt(g['queue'])} | {fmt(g.get('directory', 0))} | "
                  f"{fmt(g['keyspace'])} | {lv['enc']} |")


def bench_masters(masters=3, shards=16):
    """The cost benchmark's cluster: its tenants `bench-t<i>` in their shards (FNV-1a-64 of
    the id mod 16, `Shards::shard_of`), each shard's tag's slot in the middle of its sixteenth
    (docs/DESIGN.md), slots split evenly over 3 masters (`src/redis_server.rs`). Returns each
    master's tenant indexes: ((3, 4), (0, 5, 6), (1, 2, 7)) for 8 tenants."""
    groups = [[] for _ in range(masters)]
    for i in range(TENANTS):
        h = 0xcbf29ce484222325
        for b in f'bench-t{i}'.encode():
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
        slot = (h % shards) * (16_384 // shards) + 16_384 // shards // 2
        m = next(m for m in range(masters) if slot < (m + 1) * 16_384 // masters)
        groups[m].append(i)
    return [tuple(g) for g in groups if g]


def q4(count):
    out = []
    layouts = (('layout 4', L4), ('layout 5 (plan: bucket field hex)', L5),
               ('**layout 5, bucket field 15 B**', {**L5, 'field': 'bin'}))
    for params, cluster in (('30', False), ('30', True), ('200', False), ('200', True)):
        for label, o in layouts:
            where = 'cluster node' if cluster else 'standalone'
            res = run(f'q4 {label}, {params} B, {where}', {**o, 'params': params}, count,
                      cluster=cluster)
            out.append((label, params, where, res))
        if cluster and params == '30':
            groups = bench_masters()
            for label, o in layouts:
                res = run_spread(f'q4 {label}, 30 B, 3 masters', o, count, groups)
                out.append((label, '30', '3 masters (emulated: the benchmark\'s tenants)', res))
    # Open question 4: the plan's layout 5 on a Redis that lowered zset-max-listpack-entries.
    res = run('q4 layout 5 (plan), zset-max-listpack-entries 64', L5, count,
              config=('--zset-max-listpack-entries', '64'))
    out.append(('layout 5 (plan) on **`zset-max-listpack-entries 64`** (not the default)', '30',
                'standalone', res))
    print('\n| execution | params | Redis | B per queued execution | row | listing | queue '
          '(chunks + directory) | dedup | keyspace | margin under 512 B | encodings |')
    print('|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|')
    for label, params, where, res in out:
        g = res['g']
        queue = g['queue'] + g.get('directory', 0)
        print(f"| {label} | {params} | {where} | **{fmt(g['total'])}** | {fmt(g['row'])} | "
              f"{fmt(g['listing'])} | {fmt(queue)} | {fmt(g['dedup'])} | "
              f"{fmt(g['keyspace'])} | {TARGET - g['total']:+.1f} | {res['enc']} |")


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    which = sys.argv[2:] or ['q1', 'q2', 'q3', 'q4']
    version = subprocess.run(['redis-server', '--version'], capture_output=True, text=True)
    print(f'{version.stdout.strip()}; {count} executions, {TENANTS} tenants of one shard')
    for q in which:
        {'q1': q1, 'q2': q2, 'q3': q3, 'q4': q4}[q](count)


if __name__ == '__main__':
    main()
