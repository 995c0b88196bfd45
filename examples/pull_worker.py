#!/usr/bin/env python3
"""A sluice pull worker in plain Python: the standard library only, nothing to install.

It leases executions from `sluice serve` over HTTP (`/api/worker/*`), runs each in a thread,
keeps their leases alive, hears cancels at once, and reports how each run ended. Copy it and
put your own flows in FLOWS.

    SLUICE_TOKEN=sk_...   # an API key with the `worker` role
    python3 examples/pull_worker.py --url http://127.0.0.1:8080 --worker-id billing-1

What it relies on (see docs/workers.md, "The pull API"):
  - A lease call names the runs this worker is running (`holding`); anything else the server
    says it holds (an earlier answer that got lost) comes back marked `recovered` and is run.
  - Heartbeats name the run's fence. A 409 `lease_lost` means another worker owns the run now:
    stop it, and do not expect its result to be kept.
  - A stop poll (`/api/worker/stops?wait=30s`) hears a cancel at once; the heartbeat would say
    so too, a third of a lease later.
  - On SIGTERM or Ctrl-C it hands running work back (`released`), so another worker starts it
    at once instead of after the lease.

It prints one JSON line per event (leased, completed, refused, ...) on stdout.
"""

import argparse
import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request


# What a call can fail with on its way (refused, reset, timed out, cut off mid-answer, an
# answer that is not JSON): worth a retry, never worth a dead thread.
TRANSIENT = (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)


class LeaseLost(Exception):
    """The server says this worker does not hold the run any more."""


class Api:
    """The few calls a pull worker makes, with the key in every request."""

    def __init__(self, url, token, worker_id):
        self.url = url.rstrip("/")
        self.token = token
        self.worker_id = worker_id

    def post(self, path, body, timeout):
        body = dict(body, worker_id=self.worker_id)
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={
                "Authorization": "Bearer " + self.token,
                "Content-Type": "application/json",
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as res:
                return json.load(res)
        except urllib.error.HTTPError as e:
            problem = {}
            try:
                problem = json.load(e)
            except ValueError:
                pass
            if e.code == 409 and problem.get("code") == "lease_lost":
                raise LeaseLost(problem.get("detail", "")) from None
            raise

    def lease(self, most, lease, holding, wait="30s"):
        body = {"max": most, "lease": lease, "holding": holding}
        return self.post("/api/worker/lease?wait=" + wait, body, timeout=45)["runs"]

    def heartbeat(self, run, lease):
        path = "/api/worker/runs/%s/heartbeat" % run["execution_id"]
        return self.post(path, {"fence": run["fence"], "lease": lease}, timeout=10)["state"]

    def complete(self, run, report):
        path = "/api/worker/runs/%s/complete" % run["execution_id"]
        return self.post(path, dict(report, fence=run["fence"]), timeout=10)

    def stops(self, wait="30s"):
        return self.post("/api/worker/stops?wait=" + wait, {}, timeout=45)["stop"]


SAYING = threading.Lock()


def say(event, **fields):
    # One write per line under a lock: print() writes the text and the newline apart, so two
    # threads saying something at once (a heartbeat hearing lease_lost as the run's report is
    # refused, right after a pause) could interleave into lines nobody can parse.
    line = json.dumps(dict(fields, event=event)) + "\n"
    with SAYING:
        sys.stdout.write(line)
        sys.stdout.flush()


# -- Flows: a function of (params, stop) returning the output, raising on failure. `stop` is
# -- a threading.Event set when the run must end (cancelled, lease lost, shutting down).

def echo(params, stop):
    return params


def sleep(params, stop):
    if stop.wait(params.get("ms", 1000) / 1000):
        return None
    return {"slept_ms": params.get("ms", 1000)}


def fail(params, stop):
    raise RuntimeError(params.get("message", "failed on purpose"))


FLOWS = {"py.echo": echo, "py.sleep": sleep, "py.fail": fail}


class Run:
    """One leased run and why it must stop, if it must."""

    def __init__(self, lease):
        self.lease = lease
        self.id = lease["execution_id"]
        self.stop = threading.Event()
        self.why = None  # "cancel", "lost" or "shutdown"

    def halt(self, why):
        if self.why is None:
            self.why = why
        self.stop.set()


class Worker:
    def __init__(self, api, concurrency, lease):
        self.api = api
        self.concurrency = concurrency
        self.lease = lease
        self.lease_s = parse_seconds(lease)
        self.running = {}
        self.lock = threading.Lock()
        self.freed = threading.Condition(self.lock)
        self.quit = threading.Event()

    def serve(self):
        threading.Thread(target=self.heartbeats, daemon=True).start()
        threading.Thread(target=self.hear_stops, daemon=True).start()
        pause = 0.1
        while not self.quit.is_set():
            with self.lock:
                while len(self.running) >= self.concurrency and not self.quit.is_set():
                    self.freed.wait(1)
                free = self.concurrency - len(self.running)
                holding = list(self.running)
            if self.quit.is_set():
                break
            try:
                runs = self.api.lease(free, self.lease, holding)
                pause = 0.1
            except TRANSIENT as e:
                say("lease_failed", error=str(e))
                self.quit.wait(pause)
                pause = min(pause * 2, 5)
                continue
            for lease in runs:
                self.launch(lease)
        self.release_all()

    def launch(self, lease):
        run = Run(lease)
        with self.lock:
            if run.id in self.running:
                return
            self.running[run.id] = run
        say("leased", id=run.id, fence=lease["fence"], attempt=lease["attempt"],
            recovered=lease["recovered"])
        threading.Thread(target=self.execute, args=(run,), daemon=True).start()

    def execute(self, run):
        flow = FLOWS.get(run.lease["flow_id"])
        try:
            if flow is None:
                raise LookupError("no flow %s in this worker" % run.lease["flow_id"])
            output = flow(run.lease["params"], run.stop)
            report = {"outcome": "completed", "output": output}
        except Exception as e:  # a flow's failure fails its run, never the worker
            report = {"outcome": "failed", "retryable": True,
                      "error": {"kind": type(e).__name__, "message": str(e)}}
        if run.why == "cancel":
            report = {"outcome": "cancelled"}
        elif run.why == "shutdown":
            report = {"outcome": "released"}
        self.report(run, report)

    def report(self, run, report):
        # A report is applied once however often it is sent: repeat it until it is heard.
        for attempt in range(20):
            try:
                answer = self.api.complete(run.lease, report)
                say(report["outcome"], id=run.id, result=answer["result"])
                break
            except LeaseLost:
                say("refused", id=run.id, outcome=report["outcome"])
                break
            except TRANSIENT as e:
                say("report_failed", id=run.id, error=str(e))
                time.sleep(min(0.1 * 2 ** attempt, 2))
        with self.lock:
            self.running.pop(run.id, None)
            self.freed.notify_all()

    def heartbeats(self):
        while not self.quit.wait(self.lease_s / 3):
            with self.lock:
                runs = list(self.running.values())
            for run in runs:
                try:
                    if self.api.heartbeat(run.lease, self.lease) == "cancel_requested":
                        run.halt("cancel")
                except LeaseLost:
                    say("lease_lost", id=run.id)
                    run.halt("lost")
                except TRANSIENT as e:
                    say("heartbeat_failed", id=run.id, error=str(e))

    def hear_stops(self):
        while not self.quit.is_set():
            try:
                ids = self.api.stops()
            except TRANSIENT:
                self.quit.wait(1)
                continue
            with self.lock:
                for i in ids:
                    if i in self.running:
                        self.running[i].halt("cancel")

    def release_all(self):
        with self.lock:
            runs = list(self.running.values())
        for run in runs:
            run.halt("shutdown")
        deadline = time.monotonic() + 10
        with self.lock:
            while self.running and time.monotonic() < deadline:
                self.freed.wait(0.5)


def parse_seconds(text):
    if text.endswith("ms"):
        return int(text[:-2]) / 1000
    if text.endswith("s"):
        return int(text[:-1])
    if text.endswith("m"):
        return int(text[:-1]) * 60
    raise ValueError("a duration such as 500ms, 30s or 5m: %r" % text)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8080"))
    p.add_argument("--worker-id", default="py-%d" % os.getpid())
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--lease", default="30s", help="lease of each run (heartbeats every third)")
    args = p.parse_args()
    token = os.environ.get("SLUICE_TOKEN")
    if not token:
        sys.exit("set SLUICE_TOKEN to an API key with the worker role")
    worker = Worker(Api(args.url, token, args.worker_id), args.concurrency, args.lease)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.quit.set())
    worker.serve()


if __name__ == "__main__":
    main()
