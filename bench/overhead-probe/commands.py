#!/usr/bin/env python3
"""Where the Redis commands of an execution go, by path and by command (issue 39, item 1;
bench/README.md, "Commands per execution").

`sluice-bench --cost` counts the commands of an end-to-end run from `INFO commandstats`: one
total per command name, with no way to tell an admission's HGET from a completion's. This
records the same kind of run with `MONITOR` instead, which names each script call (`fcall
<library>_<operation>`) and lists the commands it ran (the `lua` lines that follow it), so
every command is put on the operation that ran it:

    commands.py target/release/sluice [count] [rate] [idle_secs]

starts a redis-server, `sluice serve` (sweeper on, default interval) and `sluice worker
--demo-flows --concurrency 256`, records an idle window of `idle_secs` (default 10; nothing
admitted: what the sweeper, the orphan scans and the wake-up reads cost per second), then
admits `count` (default 400) `demo.echo` executions with a dedup key each over HTTP at `rate`
per second (default 25, 8 tenants, as the cost run's callgrind window) and records until the
last one completed. It prints, per operation, calls and commands per execution, by command
name, then the idle rate and what it adds per execution at this rate (the load window's
length times the idle rate, divided by the executions): the share that the cost run's
instruction figure takes out, but its command count does not.

Python's standard library only; needs redis-server. Its own connections (the MONITOR one and
the completion polls) are left out of the counts.
"""

import collections, json, os, socket, subprocess, sys, tempfile, threading, time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe import R, free_port, wait_port, parse_monitor  # noqa: E402

TOKEN = 'cmds-admin-token-0123456789abcdef'
TENANTS = ['bench-t%d' % i for i in range(8)]


def http(method, url, body, headers):
    req = urllib.request.Request(url, data=body.encode() if body else None, method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Recorder:
    """A MONITOR connection's lines, from `start()` until `stop()` (bounded: 2 M lines)."""

    def __init__(self, port):
        self.mon = R(port, timeout=None)
        self.lines, self.on = [], False
        self.mon.send('MONITOR')
        assert self.mon.f.readline().startswith(b'+OK')
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        while len(self.lines) < 2_000_000:
            line = self.mon.f.readline()
            if not line:
                return
            if self.on:
                self.lines.append(line.decode('latin-1').rstrip('\r\n'))

    def window(self):
        out, self.lines = self.lines, []
        return out


def attribute(lines, own):
    """{operation: Counter(command)} and {operation: calls}: a script call's commands go to its
    operation, a top-level command to `(top-level) <name>`; `own` clients are left out."""
    by_op = collections.defaultdict(collections.Counter)
    calls = collections.Counter()
    op = None
    for line in lines:
        parsed = parse_monitor(line)
        if not parsed:
            continue
        client, args = parsed
        if client == 'lua':
            if op is not None:
                by_op[op][args[0].decode().lower()] += 1
            continue
        addr = client
        name = args[0].decode().lower()
        if addr in own:
            op = None
            continue
        if name in ('fcall', 'fcall_ro', 'evalsha', 'eval'):
            fn = args[1].decode()
            op = fn.rsplit('_', 1)[-1] if name.startswith('fcall') else 'script ' + fn[:8]
            calls[op] += 1
        else:
            op = None
            by_op['(top-level)'][name] += 1
    return by_op, calls


def example(lines, own, which=20):
    """The commands of the `which`-th call of each operation, in order (for reading)."""
    seen, out, cur = collections.Counter(), {}, None
    for line in lines:
        parsed = parse_monitor(line)
        if not parsed:
            continue
        client, args = parsed
        if client == 'lua':
            if cur is not None:
                cur.append(' '.join(a.decode('latin-1')[:40] for a in args))
            continue
        cur = None
        name = args[0].decode().lower()
        if client not in own and name.startswith('fcall'):
            op = args[1].decode().rsplit('_', 1)[-1]
            seen[op] += 1
            if seen[op] == which:
                cur = out[op] = []
    for op, cmds in out.items():
        print('\n%s (call %d): %d commands' % (op, which, len(cmds)))
        for c in cmds:
            print('   ', c)


def report(title, by_op, calls, per):
    print('\n%s (per %s)' % (title, per[1]))
    total = 0
    for op in sorted(by_op, key=lambda o: -sum(by_op[o].values())):
        c = by_op[op]
        n = sum(c.values())
        total += n
        parts = ', '.join('%s %.2f' % (k, v / per[0]) for k, v in c.most_common())
        print('  %-22s calls %6.3f  commands %6.2f: %s' % (op, calls.get(op, 0) / per[0],
                                                          n / per[0], parts))
    for op in calls:
        if op not in by_op:
            print('  %-22s calls %6.3f  commands   0.00' % (op, calls[op] / per[0]))
    print('  %-22s calls %6.3f  commands %6.2f' % ('TOTAL', sum(calls.values()) / per[0],
                                                   total / per[0]))
    return total


def main():
    sluice = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    rate = float(sys.argv[3]) if len(sys.argv) > 3 else 25.0
    idle_secs = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
    work = tempfile.mkdtemp(prefix='sluice-commands-')
    port = free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(
            ['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--save', '',
             '--appendonly', 'no', '--dir', work], stdout=subprocess.DEVNULL))
        wait_port(port)
        url = 'redis://127.0.0.1:%d' % port
        hp = free_port()
        env = dict(os.environ, SLUICE_ADMIN_TOKEN=TOKEN, RUST_LOG='warn')
        procs.append(subprocess.Popen(
            [sluice, 'serve', '--listen', '127.0.0.1:%d' % hp, '--redis-url', url,
             '--default-max-concurrent', '1000000', '--default-max-queued', '1000000'],
            env=env, stdout=open(os.path.join(work, 'serve.log'), 'w'),
            stderr=subprocess.STDOUT))
        base = 'http://127.0.0.1:%d' % hp
        for _ in range(300):
            try:
                if http('GET', base + '/readyz', None, {})[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        procs.append(subprocess.Popen(
            [sluice, 'worker', '--demo-flows', '--concurrency', '256', '--redis-url', url],
            env=env, stdout=open(os.path.join(work, 'worker.log'), 'w'),
            stderr=subprocess.STDOUT))
        time.sleep(3)
        poll = R(port)
        own = set()
        rec = Recorder(port)
        for r in (poll, rec.mon):
            own.add('%s:%d' % r.s.getsockname()[:2])
        shards = sorted({k.decode().split('}')[0] + '}:stats'
                         for k in poll.call('KEYS', 'sluice:{s*}:*')})

        def completed():
            return sum(int(poll.call('HGET', s, 'completed') or 0) for s in shards)

        rec.on = True
        time.sleep(idle_secs)
        idle = rec.window()

        start = time.time()
        body = json.dumps({'flow_id': 'demo.echo', 'params': {'n': 0, 'p': 'x' * 14}})
        status = collections.Counter()
        lock = threading.Lock()

        def admit(i):
            h = {'Authorization': 'Bearer ' + TOKEN, 'X-Tenant-Id': TENANTS[i % 8],
                 'Content-Type': 'application/json', 'Idempotency-Key': 'cmds-%d' % i}
            s = http('POST', base + '/api/executions', body, h)[0]
            with lock:
                status[s] += 1

        threads = []
        for i in range(count):
            at = start + i / rate
            time.sleep(max(0.0, at - time.time()))
            t = threading.Thread(target=admit, args=(i,))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(120)
        shards = sorted({k.decode().split('}')[0] + '}:stats'
                         for k in poll.call('KEYS', 'sluice:{s*}:stats')})
        deadline = time.time() + 120
        while completed() < count and time.time() < deadline:
            time.sleep(0.1)
        secs = time.time() - start
        load = rec.window()
        rec.on = False
        done = completed()
        print('admissions: %s; completed %d of %d in %.1f s (%.1f/s)' % (
            dict(status), done, count, secs, rate))
        i_ops, i_calls = attribute(idle, own)
        l_ops, l_calls = attribute(load, own)
        n = max(done, 1)
        total = report('load window', l_ops, l_calls, (n, 'execution'))
        idle_total = report('idle window', i_ops, i_calls, (idle_secs, 'second'))
        share = idle_total / idle_secs * secs / n
        if os.environ.get('EXAMPLE'):
            example(load, own, int(os.environ['EXAMPLE']))
        print('\nidle share at %.1f/s: %.2f commands per execution; without it %.2f' % (
            rate, share, total / n - share))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == '__main__':
    main()
