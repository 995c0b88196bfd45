#!/usr/bin/env python3
"""Measures deleting a big tenant (docs/api.md, "Deleting a tenant"): how long until it is
gone, what each `tenant_reap.lua` call holds Redis for, how much of Redis the reap takes, and
what another tenant of the same shard sees meanwhile (its admission latency, before and
during). A measurement that prints a report, not a test: it asserts only that nothing of the
tenant is left.

    scripts/reap_measure.py target/debug/sluice 20000

Starts its own redis-server and `sluice serve` on free loopback ports and stops both at the
end. Every command's duration is taken from Redis's SLOWLOG (threshold 0 while the reap
runs), so the script times are Redis's own, whatever the client's build.
"""

import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from harness import free_port, start_redis, wait_port

SLUICE, N = sys.argv[1], int(sys.argv[2])
TOKEN = "measure-admin-token-0123456789abcdef"
BULK = "bulk"


def shard(tenant, count=16):
    """The tenant's shard, as `ShardMap::shard_of` computes it (FNV-1a-64 mod count)."""
    h = 0xCBF29CE484222325
    for b in tenant.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % count


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * p))]


def main():
    tmp = tempfile.mkdtemp()
    redis, url = start_redis(tmp)
    port = url.rsplit(":", 1)[1]
    api = free_port()
    serve = subprocess.Popen(
        [SLUICE, "serve", "--redis-url", url, "--listen", f"127.0.0.1:{api}",
         "--admin-token", TOKEN],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def cli(*args):
        return subprocess.run(["redis-cli", "-p", port, *args], capture_output=True,
                              text=True).stdout

    def call(method, path, body=None, tenant=None):
        req = urllib.request.Request(f"http://127.0.0.1:{api}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Authorization", f"Bearer {TOKEN}")
        req.add_header("Content-Type", "application/json")
        if tenant:
            req.add_header("X-Tenant-Id", tenant)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    try:
        wait_port(api)
        other = next(f"other{i}" for i in range(1000) if shard(f"other{i}") == shard(BULK))
        # Limits of 0: nothing starts, every execution stays queued (no worker runs anyway).
        call("PUT", f"/api/tenants/{BULK}", {"max_concurrent": 0})
        call("PUT", f"/api/tenants/{other}", {"max_concurrent": 0})
        for b in range(0, N, 1000):
            items = [{"flow_id": f"flow{i % 7}", "params": {"i": i}, "dedup_key": f"k{i}"}
                     for i in range(b, min(N, b + 1000))]
            status, _ = call("POST", "/api/executions/batch", {"items": items}, BULK)
            assert status == 200, status
        print(f"{N} executions queued for {BULK}; {other} shares its shard {shard(BULK)}")

        def admit_for(seconds, out):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t0 = time.monotonic()
                status, _ = call("POST", "/api/executions", {"flow_id": "x"}, other)
                out.append((time.monotonic() - t0) * 1000)
                assert status == 201, status
                time.sleep(0.01)

        before, during = [], []
        admit_for(3, before)
        cli("CONFIG", "RESETSTAT")
        cli("CONFIG", "SET", "slowlog-max-len", "1000000")
        cli("CONFIG", "SET", "slowlog-log-slower-than", "0")
        cli("SLOWLOG", "RESET")
        stop = threading.Event()

        def neighbour():
            while not stop.is_set():
                admit_for(0.2, during)

        t0 = time.monotonic()
        status, _ = call("DELETE", f"/api/tenants/{BULK}")
        answered = time.monotonic() - t0
        worker = threading.Thread(target=neighbour)
        worker.start()
        while call("GET", f"/api/tenants/{BULK}")[0] != 404:
            time.sleep(0.05)
        gone = time.monotonic() - t0
        stop.set()
        worker.join()
        cli("CONFIG", "SET", "slowlog-log-slower-than", "10000")
        raw = subprocess.run(["redis-cli", "-p", port, "--json", "SLOWLOG", "GET", "1000000"],
                             capture_output=True, text=True).stdout
        scripts = [e for e in json.loads(raw) if str(e[3][0]).lower() == "evalsha"]
        # A reap call names 3 keys: the freeze marker, the tenant's cfg, the reaping set.
        is_reap = lambda e: str(e[3][2]) == "3" and f":t:{BULK}:cfg" in str(e[3][4])
        reaps = [e[2] for e in scripts if is_reap(e)]
        others = [e[2] for e in scripts if not is_reap(e)]
        print(f"DELETE answered {status} in {answered * 1000:.0f} ms; gone after {gone:.2f} s "
              f"({N / gone:.0f} executions/s)")
        print(f"reap calls: {len(reaps)}, µs p50 {pct(reaps, 0.5)}, p90 {pct(reaps, 0.9)}, "
              f"p99 {pct(reaps, 0.99)}, max {max(reaps)}; Redis busy reaping "
              f"{sum(reaps) / 1000:.0f} ms of {gone * 1000:.0f} ms "
              f"({100 * sum(reaps) / 1000 / (gone * 1000):.0f} %)")
        if others:
            print(f"{other}'s script calls meanwhile: {len(others)}, µs p50 {pct(others, 0.5)}, "
                  f"p99 {pct(others, 0.99)}")
        print(f"{other}'s admissions (HTTP, ms): before p50 {pct(before, 0.5):.2f} "
              f"p99 {pct(before, 0.99):.2f} (n={len(before)}); during p50 "
              f"{pct(during, 0.5):.2f} p99 {pct(during, 0.99):.2f} (n={len(during)})")
        left = cli("--scan", "--pattern", f"*:t:{BULK}:*").split()
        lua = ('local n = 0 for _, k in ipairs(redis.call("KEYS", "sluice:*:exec:*")) do '
               'if redis.call("HGET", k, "tenant") == ARGV[1] then n = n + 1 end end return n')
        rows = int(cli("EVAL", lua, "0", BULK).strip())
        print(f"left of {BULK}: {len(left)} keys, {rows} rows")
        assert not left and rows == 0
    finally:
        serve.terminate()
        serve.wait()
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
