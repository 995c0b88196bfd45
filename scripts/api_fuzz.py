"""Schema-driven fuzzing of a live sluice with Schemathesis, as each kind of caller.

Run by scripts/api_fuzz.sh, which installs Schemathesis into a virtualenv first. Starts its own
redis-server and `sluice serve` on free loopback ports, registers a tenant, and runs
`schemathesis run` (all checks, bounded examples and time) against /openapi.json as a worker,
a viewer, an editor and an admin key of that tenant, then as the platform admin acting for it. Every run
must report no failure, and the server's own metrics must show no 5xx answer at all.

Usage: python api_fuzz.py <sluice binary> <schemathesis binary> <work folder>
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from harness import free_port, start_redis

ADMIN_TOKEN = "fuzz-admin-token-" + os.urandom(8).hex()
# The scraper's token: /metrics answers 401 without it.
METRICS_TOKEN = "fuzz-metrics-token-0123456789"
TENANT = "acme"
HERE = os.path.dirname(os.path.abspath(__file__))
# Per run: test cases per operation and seconds; five runs stay within about two and a half
# minutes.
MAX_EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "25"))
MAX_SECONDS = int(os.environ.get("SLUICE_FUZZ_SECONDS", "25"))


def call(base, method, path, token, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as res:
        return json.loads(res.read() or b"null")


def wait_ready(base, deadline_s=30):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=2) as res:
                if res.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit("sluice did not become ready")


def new_key(base, role):
    return call(base, "POST", f"/api/tenants/{TENANT}/api-keys", ADMIN_TOKEN,
                {"role": role, "name": f"fuzz {role}"})["token"]


def fuzz(st_bin, base, work, name, headers):
    """One Schemathesis run; its test-case count and whether it passed."""
    log = os.path.join(work, f"{name}.log")
    cmd = [st_bin, "--config-file", os.path.join(HERE, "api-fuzz", "schemathesis.toml"),
           "--no-color", "run", base + "/openapi.json",
           "--checks", "all",
           "--max-examples", str(MAX_EXAMPLES),
           "--max-time", str(MAX_SECONDS),
           # One worker: Hypothesis' lambda-source cache is not thread-safe (runtime errors
           # "AST constructor recursion depth mismatch" with more).
           "--workers", "1",
           "--seed", os.environ.get("SLUICE_FUZZ_SEED", "1"),
           "--generation-database", "none"]
    for h in headers:
        cmd += ["-H", h]
    env = dict(os.environ, SCHEMATHESIS_HOOKS="hooks",
               PYTHONPATH=os.path.join(HERE, "api-fuzz"))
    started = time.monotonic()
    with open(log, "w") as out:
        # In the work folder: Schemathesis keeps a cache folder where it runs.
        status = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work,
                                timeout=MAX_SECONDS * 4 + 60).returncode
    took = time.monotonic() - started
    text = open(log).read()
    cases = re.search(r"(\d+) generated", text)
    cases = int(cases.group(1)) if cases else 0
    verdict = "passed" if status == 0 else f"FAILED (exit {status}, see {log})"
    print(f"  {name:<15} {cases:>6} test cases in {took:5.1f} s: {verdict}", flush=True)
    if status != 0:
        tail = [l if len(l) < 400 else l[:400] + " ..." for l in text.splitlines()[-80:]]
        print("\n".join("    " + l for l in tail), file=sys.stderr)
    return status == 0


def served(base):
    """Requests the server answered, and how many with a 5xx, from its own metrics."""
    req = urllib.request.Request(base + "/metrics",
                                 headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as res:
        text = res.read().decode()
    total = server_errors = 0
    for line in text.splitlines():
        m = re.match(r'sluice_http_request_duration_seconds_count\{.*status="(\d+)"\} (\d+)', line)
        if m:
            total += int(m.group(2))
            if m.group(1).startswith("5"):
                server_errors += int(m.group(2))
                print(f"  5xx: {line}", file=sys.stderr)
    return total, server_errors


def main(sluice_bin, st_bin, work):
    sluice_bin, st_bin, work = (os.path.abspath(p) for p in (sluice_bin, st_bin, work))
    os.makedirs(work, exist_ok=True)
    data = tempfile.mkdtemp(prefix="sluice-fuzz-")
    api_port = free_port()
    procs = []
    try:
        redis, redis_url = start_redis(data)
        procs.append(redis)
        env = dict(os.environ, SLUICE_ADMIN_TOKEN=ADMIN_TOKEN,
                   SLUICE_METRICS_TOKEN=METRICS_TOKEN, RUST_LOG="warn")
        with open(os.path.join(work, "serve.log"), "w") as log:
            procs.append(subprocess.Popen(
                [sluice_bin, "serve", "--listen", f"127.0.0.1:{api_port}",
                 "--redis-url", redis_url,
                 # An event stream of an execution nothing runs lasts its lifetime.
                 "--events-lifetime-secs", "1",
                 # Addresses Schemathesis makes up must not be called: delivery stays off.
                 "--webhook-delivery", "false"],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{api_port}"
        wait_ready(base)
        call(base, "PUT", f"/api/tenants/{TENANT}", ADMIN_TOKEN, {})
        started = time.monotonic()
        print(f"api fuzz: Schemathesis against {base}, as each caller "
              f"(at most {MAX_EXAMPLES} cases per operation, {MAX_SECONDS} s per run)")
        ok = True
        # Tenant keys first: the platform admin's run may disable or delete the tenant.
        for role in ["worker", "viewer", "editor", "admin"]:
            token = new_key(base, role)
            ok &= fuzz(st_bin, base, work, f"tenant {role}", [f"Authorization: Bearer {token}"])
        ok &= fuzz(st_bin, base, work, "platform admin",
                   [f"Authorization: Bearer {ADMIN_TOKEN}", f"X-Tenant-Id: {TENANT}"])
        total, server_errors = served(base)
        took = time.monotonic() - started
        print(f"api fuzz: {total} requests answered in {took:.0f} s, {server_errors} with a 5xx")
        if not ok or server_errors:
            raise SystemExit("api fuzz FAILED")
        print("schemathesis: 5 passed, 0 failed")
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main(*sys.argv[1:4])
