"""The web console, tested in a real browser.

Run by scripts/console_test.sh, which installs Debian's chromium and chromium-driver when
missing and Selenium (pinned) into a virtualenv. Starts its own redis-server, `sluice serve`
(with an admin token), `sluice worker --demo-flows` and a second `sluice serve --dev-auth`,
all on free loopback ports, then drives /usr/bin/chromium (headless) through
/usr/bin/chromedriver: nothing downloads a browser or a driver.

What a user would check, each step waiting for a condition (never a fixed sleep): login with
a bad and a good token; tenants registered and their limits edited, with their effect (429,
then a waiting execution started); keys created (token shown once) and revoked (401
after, and a signed-in session sent back to the login); admit from the form (201, replay,
422 with the holder, 429 with Retry-After); `<img onerror>` in params shown as text; a
demo.sleep row turning from running to completed without a reload, the detail page live over
SSE; the overview's charts, its tenants with work now (an unregistered one included) and its
folded shard table; a tenant's trends chart whose totals match the executions it admitted;
cancel, retry, force delete (typed confirmation); bulk cancel and retry; admissions with
a priority and a delay or a date-time, listed as scheduled with their due time, the scheduled
filter (in the URL) listing only those, a reschedule from the detail page to a nearer time and
then to now (it runs), the API's refusals shown; a tenant's weight set and read back; a
concurrency key admitted from the form, shown in the list and on the detail page; a tenant's
max_concurrent_per_key set and read back; a key's override set, listed with its limit, held (an
execution of it waits, the key counted blocked) and deleted (it runs); a tenant's webhook set
from its page (a bad address refused with the API's reason, the signing secret shown once), an
execution's end delivered to a receiver on loopback (a small http.server in this script) with a
signature that verifies, listed in the page's delivery log, the secret kept or rotated, then the
webhook removed after a confirmation; dry runs from the form
(admit, duplicate, conflict, a full queue refused) admitting nothing; a tenant's rate limits set,
read back after a reload, refused when invalid and removed; a waiting execution's place in the
queue and expected start, in the list and on its detail page; a dead letter
replayed and dismissed; filters in the URL surviving a reload; jump to an id; role gating for
viewer, editor, admin and platform admin; dev auth without login; and no console errors
(every browser log entry of level SEVERE fails the run, except the network lines of the API
answers the test provokes on purpose: 4xx from /api/). On failure a screenshot and the page's
HTML are kept in the work folder.

Long on purpose: one browser session walks the whole console in order (each step builds on
what the one before left: the tenant, its key, its executions), with the page helpers it
needs at the top.

Usage: python console_test.py <sluice binary> <work folder> [--screenshots <folder>]
"""

import re
import base64
import datetime
import hashlib
import hmac
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from harness import free_port, start_redis

ADMIN_TOKEN = "console-admin-" + os.urandom(12).hex()
WAIT_S = 20
DEADLINE_S = 240
checks = 0
started = time.monotonic()


class Failed(Exception):
    pass


def check(condition, what):
    global checks
    if not condition:
        raise Failed(what)
    checks += 1
    print(f"  ok  {what}", flush=True)


class Api:
    """Plain HTTP to the API, for setup and for checking what the browser did."""

    def __init__(self, base, token):
        self.base, self.token = base, token

    def call(self, method, path, body=None, tenant=None, token=None, headers=None):
        headers = {"Authorization": f"Bearer {token or self.token}", **(headers or {})}
        if tenant:
            headers["X-Tenant-Id"] = tenant
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as res:
                raw = res.read()
                return res.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, (json.loads(raw) if raw else None)

    def ready(self, deadline_s=30):
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/readyz", timeout=2) as res:
                    if res.status == 200:
                        return
            except Exception:  # not listening yet
                pass
            time.sleep(0.1)
        raise Failed("sluice did not become ready")


class Receiver:
    """A webhook receiver on loopback (a free port): records each POST's headers (lower-case
    names) and body, and answers 204. Use it in a `with` block, which stops it."""

    def __init__(self):
        self.posts = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.posts.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self):
        with self.lock:
            return list(self.posts)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def verify_signature(secret, headers, body):
    """Whether a delivery's `webhook-signature` holds the Standard Webhooks signature made with
    `secret`: `v1,` and the base64 HMAC-SHA256, keyed with the base64-decoded part after
    `whsec_`, of `<webhook-id>.<webhook-timestamp>.<body>` (the header may list several,
    separated by spaces)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    want = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(want, given) for given in headers["webhook-signature"].split(" "))


class Console:
    """The browser, with helpers that wait for conditions."""

    def __init__(self, driver, base):
        self.d, self.base = driver, base
        self.allowed_network_errors = 0

    def open(self, hash_=""):
        """Loads the console afresh (a new document, even if only the hash differs)."""
        self.d.get("about:blank")
        self.d.get(f"{self.base}/console/{hash_}")

    def go(self, hash_):
        """Navigates inside the app (no reload)."""
        self.d.execute_script("location.hash = arguments[0]", hash_)

    def until(self, cond, what, timeout=WAIT_S):
        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.1,
                                 ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda d: cond())
        except TimeoutException:
            raise Failed(f"timed out waiting for: {what}")

    def clear_toasts(self):
        """Dismisses the messages in the corner, as a user would before clicking under them."""
        self.d.execute_script("document.querySelectorAll('.toast').forEach((t) => t.click())")

    def sees(self, cond, what, timeout=WAIT_S):
        """Waits for what a user would see, and counts it as a check."""
        found = self.until(cond, what, timeout)
        check(True, what)
        return found

    def el(self, css, what=None, timeout=WAIT_S):
        def find():
            found = self.d.find_elements(By.CSS_SELECTOR, css)
            return found[0] if found and found[0].is_displayed() else None
        return self.until(find, what or css, timeout)

    def gone(self, css, what=None):
        self.until(lambda: not self.d.find_elements(By.CSS_SELECTOR, css), what or f"{css} gone")

    def present(self, css):
        return bool(self.d.find_elements(By.CSS_SELECTOR, css))

    def shown(self, css):
        """Whether the first element `css` matches is there and visible (not `hidden`)."""
        found = self.d.find_elements(By.CSS_SELECTOR, css)
        return bool(found) and found[0].is_displayed()

    def text(self, css):
        """The text of the first element `css` matches. The listing re-renders itself, so an
        element found may be replaced before it is read: then it is found again (bounded)."""
        for _ in range(20):
            try:
                return self.el(css).text
            except StaleElementReferenceException:
                continue
        return self.el(css).text

    def attr(self, css, name):
        """An attribute of the first element `css` matches, found again like text()'s."""
        for _ in range(20):
            try:
                return self.el(css).get_attribute(name)
            except StaleElementReferenceException:
                continue
        return self.el(css).get_attribute(name)

    def type(self, css, value):
        e = self.el(css)
        e.clear()
        e.send_keys(value)
        return e

    def click(self, css):
        """Clicks the first element `css` matches, found again like text()'s if the page
        replaced it in between (a refreshing list)."""
        for _ in range(20):
            try:
                self.el(css).click()
                return
            except StaleElementReferenceException:
                continue
        self.el(css).click()

    def row_status(self, exec_id):
        rows = self.d.find_elements(By.CSS_SELECTOR, f'#executions-body tr[data-id="{exec_id}"]')
        return rows[0].get_attribute("data-status") if rows else None

    def console_errors(self):
        """SEVERE browser log entries, minus the API answers the test provokes (4xx)."""
        bad = []
        for entry in self.d.get_log("browser"):
            if entry["level"] != "SEVERE":
                continue
            msg = entry["message"]
            if entry.get("source") == "network" and "/api/" in msg and " 4" in msg:
                self.allowed_network_errors += 1
                continue
            bad.append(msg)
        return bad

    def login(self, token):
        self.d.execute_script("sessionStorage.clear()")
        self.open("#/login")
        self.type("#login-token", token)
        self.click("#login-submit")

    def admit(self, flow, params="{}", dedup="", priority=3, delay=None, run_at=None, ckey="", dry_run=False):
        """The New execution form; `run_at` is what a user puts in the date-time box, `ckey`
        the concurrency key; `dry_run` presses Dry run instead of Admit."""
        if not self.d.find_element(By.CSS_SELECTOR, "#admit-panel").is_displayed():
            self.click("#new-execution")
        self.type("#admit-flow", flow)
        self.type("#admit-params", params)
        self.type("#admit-dedup", dedup)
        self.type("#admit-ckey", ckey)
        Select(self.el("#admit-priority")).select_by_value(str(priority))
        self.start("admit", delay, run_at, now=True)
        self.d.execute_script("document.getElementById('admit-result').replaceChildren()")
        self.click("#admit-dry-run-submit" if dry_run else "#admit-submit")
        res = self.until(lambda: self.d.find_elements(By.CSS_SELECTOR, "#admit-result > *"), "an admission answer")
        return res[0]

    def start(self, prefix, delay, run_at, now):
        """Picks a start (now, after a delay or at a date-time) in a form's schedule control."""
        when = "delay" if delay is not None else "at" if run_at is not None else "now"
        if when == "now" and not now:
            raise ValueError("this form has no 'now'")
        Select(self.el(f"#{prefix}-when")).select_by_value(when)
        if delay is not None:
            self.type(f"#{prefix}-delay", delay)
        if run_at is not None:
            # A datetime-local box takes keys in the browser's locale order; a user's pick is
            # its value, so set that (and tell the page, as picking does).
            box = self.el(f"#{prefix}-run-at")
            self.d.execute_script("arguments[0].value = arguments[1];"
                                  "arguments[0].dispatchEvent(new Event('input', {bubbles: true}))", box, run_at)

    def admitted_id(self, flow, params="{}", dedup="", **options):
        res = self.admit(flow, params, dedup, **options)
        check(res.get_attribute("id") == "admit-created", f"{flow} admitted from the form ({res.text})")
        return res.find_element(By.CSS_SELECTOR, "a.exec-link").get_attribute("data-id")

    def confirm(self, typed=None):
        if typed is not None:
            self.type("#confirm-input", typed)
        self.click("#confirm-ok")
        self.gone("dialog.confirm", "the confirmation closed")

    def shot(self, path):
        self.d.save_screenshot(path)


def main(sluice, work, screenshots):
    os.makedirs(work, exist_ok=True)
    data = tempfile.mkdtemp(prefix="sluice-console-")
    api_port, dev_port = free_port(), free_port()
    procs, driver = [], None
    logs = open(os.path.join(work, "processes.log"), "w")
    try:
        redis_proc, redis = start_redis(data, stdout=logs, stderr=logs)
        procs.append(redis_proc)
        env = dict(os.environ, SLUICE_ADMIN_TOKEN=ADMIN_TOKEN)
        # --webhook-allow-private: the webhook test's receiver listens on loopback.
        procs.append(subprocess.Popen(
            [sluice, "serve", "--listen", f"127.0.0.1:{api_port}", "--redis-url", redis,
             "--webhook-allow-private"],
            env=env, stdout=logs, stderr=logs))
        procs.append(subprocess.Popen(
            [sluice, "worker", "--demo-flows", "--redis-url", redis, "--concurrency", "8",
             "--retry-backoff-ms", "100", "--heartbeat-ms", "1000", "--lease-ttl-ms", "5000"],
            stdout=logs, stderr=logs))
        # This one delivers no webhook: it would refuse the loopback receiver (a failed attempt,
        # then a backoff) whenever it took a tenant's deliveries before the server above.
        procs.append(subprocess.Popen(
            [sluice, "serve", "--dev-auth", "--listen", f"127.0.0.1:{dev_port}", "--redis-url", redis,
             "--sweep-interval-secs", "0", "--webhook-delivery", "false"], stdout=logs, stderr=logs))
        base = f"http://127.0.0.1:{api_port}"
        api = Api(base, ADMIN_TOKEN)
        api.ready()
        Api(f"http://127.0.0.1:{dev_port}", "").ready()

        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1440,1000", "--no-first-run", "--disable-extensions",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--metrics-recording-only", "--no-default-browser-check",
                    f"--user-data-dir={os.path.join(data, 'chromium')}"]:
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = Service(executable_path="/usr/bin/chromedriver", log_output=os.path.join(work, "chromedriver.log"))
        driver = webdriver.Chrome(service=service, options=options)
        driver.set_page_load_timeout(20)
        ui = Console(driver, base)
        try:
            run(ui, api, base, f"http://127.0.0.1:{dev_port}", screenshots)
        except BaseException:
            try:
                ui.shot(os.path.join(work, "failure.png"))
                with open(os.path.join(work, "failure.html"), "w") as f:
                    f.write(driver.page_source)
                print(f"console test: screenshot and HTML kept in {work}/failure.png, failure.html", file=sys.stderr)
            except Exception as e:  # the browser itself may be gone
                print(f"console test: no screenshot ({e})", file=sys.stderr)
            raise
    finally:
        if driver is not None:
            driver.quit()
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        logs.close()
        shutil.rmtree(data, ignore_errors=True)


def local_input(dt):
    """A datetime-local box's value for a moment, in local time (the browser shares our zone)."""
    return dt.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def parse_time(iso):
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def shown_time(iso):
    """An RFC 3339 time as the console shows it in local time (dom.js fmtTime)."""
    t = parse_time(iso).astimezone()
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def no_errors(ui, where):
    errors = ui.console_errors()
    check(not errors, f"no browser console errors ({where})" + (f": {errors}" if errors else ""))


def within_deadline():
    if time.monotonic() - started > DEADLINE_S:
        raise Failed(f"the run took longer than {DEADLINE_S} s")


def run(ui, api, base, dev_base, screenshots):
    shots = screenshots or None

    def shot(name):
        if shots:
            # Without the toasts of earlier steps, which would cover the page.
            ui.d.execute_script("document.querySelectorAll('.toast').forEach((t) => t.remove())")
            ui.shot(os.path.join(shots, name))

    # --- Login: a bad token, then the platform admin token.
    ui.open()
    ui.el("#login-form", "the login form (no credential yet)")
    # A first visit without a token asks nothing of /api: no refused request in the log.
    first_visit = [e["message"] for e in ui.d.get_log("browser") if e["level"] == "SEVERE"]
    check(not first_visit, "a first visit logs no error" + (f": {first_visit}" if first_visit else ""))
    ui.type("#login-token", "not-the-token")
    ui.click("#login-submit")
    check("not accepted" in ui.text("#login-error"), "a bad token is refused on the login page")
    stored = ui.d.execute_script("return [sessionStorage.getItem('sluice.token'), localStorage.getItem('sluice.token')]")
    check(stored == [None, None], "a refused token is not kept")
    shot("login.png")
    ui.type("#login-token", ADMIN_TOKEN)
    ui.click("#login-submit")
    check(ui.text("#who-role") == "platform admin", "the admin token signs in as platform admin")
    check(ui.d.execute_script("return sessionStorage.getItem('sluice.token')") == ADMIN_TOKEN
          and ui.d.execute_script("return localStorage.getItem('sluice.token')") is None,
          "the token is in sessionStorage only")
    ui.el("#overview-activity", "the overview (platform admin's home) with its activity chart")
    no_errors(ui, "login")

    # --- Tenants: register acme and a spare one to delete.
    ui.go("#/tenants")
    for tenant in ["acme", "spare"]:
        ui.type("#new-tenant-id", tenant)
        ui.click("#register-submit")
        ui.el(f'#tenants-body tr[data-tenant="{tenant}"]', f"tenant {tenant} listed")
    check(api.call("GET", "/api/tenants/acme")[0] == 200, "acme is registered")
    row = 'tr[data-tenant="spare"]'
    ui.click(f"{row} .delete-tenant")
    ui.el("#confirm-input")
    check(ui.el("#confirm-ok").get_attribute("disabled") is not None, "delete waits for the typed tenant id")
    ui.confirm("spare")
    ui.gone(f"#tenants-body {row}", "spare no longer listed")
    check(api.call("GET", "/api/tenants/spare")[0] == 404, "spare is deleted")

    # --- API keys of acme: one per role, each token shown once.
    ui.go("#/t/acme/api-keys")
    tokens = {}
    for role in ["viewer", "editor", "admin", "worker"]:
        Select(ui.el("#new-key-role")).select_by_value(role)
        ui.type("#new-key-name", f"console {role}")
        ui.click("#create-key-submit")
        token = ui.until(lambda: (ui.d.find_elements(By.CSS_SELECTOR, "#new-key-token") or [None])[0], "the new token").get_attribute("value")
        check(token.startswith("sk_"), f"{role} key created, token shown")
        tokens[role] = token
        key_id = token.split("_")[1]
        ui.el(f'#api-keys-body tr[data-key="{key_id}"]', f"{role} key listed")
        ui.until(lambda: ui.d.find_elements(By.CSS_SELECTOR, "#copy-token"), "copy button")
        ui.d.execute_script("document.getElementById('created-key').replaceChildren()")
    listed = api.call("GET", "/api/tenants/acme/api-keys")[1]["api_keys"]
    check(len(listed) == 4 and all("token" not in k for k in listed), "four keys, no token in the list")
    check(sorted(k["role"] for k in listed) == ["admin", "editor", "viewer", "worker"],
          "one key of each role listed, the pull API's worker key too")
    shot("api-keys.png")
    no_errors(ui, "tenants and keys")

    # --- Executions: admit from the form, replay, conflict, untrusted params as text.
    ui.go("#/t/acme/executions")
    ui.el("#executions-table")
    Select(ui.el("#refresh-select")).select_by_value("2")
    ui.d.execute_script("window.__noReload = 'still here'")
    xss = '{"note": "<img src=x onerror=\\"window.__xss=1\\">", "n": 1}'
    first = ui.admitted_id("demo.echo", xss, "order-1")
    ui.until(lambda: ui.row_status(first), "the admitted row in the list")
    check(ui.row_status(first) in ("queued", "running", "completed"), "the new row shows its status")
    res = ui.admit("demo.echo", xss, "order-1")
    check(res.get_attribute("id") == "admit-replay" and first in res.text
          and res.find_element(By.CSS_SELECTOR, "a.exec-link").get_attribute("data-id") == first,
          "the same request again shows a replay of the same execution")
    res = ui.admit("demo.echo", '{"n": 2}', "order-1")
    holder = res.find_elements(By.CSS_SELECTOR, "a.exec-link")
    check(res.get_attribute("id") == "admit-conflict" and holder and holder[0].get_attribute("data-id") == first,
          "different params under the key: 422 with a link to the holder")
    shot("new-execution.png")
    holder[0].click()
    ui.until(lambda: ui.text("#detail-status") == "completed", "demo.echo completed")
    params = ui.text("#detail-params")
    check('<img src=x onerror=\\"window.__xss=1\\">' in params, "params with <img onerror> are shown as text")
    check(ui.d.execute_script("return document.querySelectorAll('#main img').length") == 0
          and ui.d.execute_script("return window.__xss") is None, "no element made of the params, nothing ran")
    check("<img" in ui.text("#detail-output"), "the output is shown as text too")
    check(ui.text("#detail-concurrency-key") == "—", "no concurrency key: the detail says none")
    no_errors(ui, "admission")

    # --- Dry runs from the form: what admission would do now, and nothing admitted. acme is
    # idle (its echo completed) and has no limit of its own, so a new request would be ready.
    ui.go("#/t/acme/executions")
    total = api.call("GET", "/api/executions", tenant="acme")[1]["total"]
    res = ui.admit("demo.echo", '{"n": 3}', dry_run=True)
    check(res.get_attribute("id") == "admit-dry-run" and res.get_attribute("data-decision") == "admit"
          and res.get_attribute("data-reason") == "ready" and "Dry run: admit (ready)" in res.text
          and "Nothing was admitted" in res.text,
          f"a dry run of a new request: admit, ready ({res.text})")
    check("next in the tenant" in ui.text("#admit-dry-run .dry-position"),
          f"the dry run says where it would stand ({res.text})")
    res = ui.admit("demo.echo", xss, "order-1", dry_run=True)
    link = res.find_elements(By.CSS_SELECTOR, "a.exec-link")
    check(res.get_attribute("data-decision") == "duplicate" and res.get_attribute("data-reason") == "same_request"
          and link and link[0].get_attribute("data-id") == first,
          f"a dry run of the same request again: duplicate of the first execution ({res.text})")
    res = ui.admit("demo.echo", '{"n": 2}', "order-1", dry_run=True)
    link = res.find_elements(By.CSS_SELECTOR, "a.exec-link")
    check(res.get_attribute("data-decision") == "conflict" and res.get_attribute("data-reason") == "idempotency_key_conflict"
          and link and link[0].get_attribute("data-id") == first,
          f"a dry run with other params under the key: conflict, its holder linked ({res.text})")
    check(api.call("GET", "/api/executions", tenant="acme")[1]["total"] == total,
          f"the dry runs admitted nothing: acme's total is still {total}")
    no_errors(ui, "dry run")

    # --- A batch from the New batch panel: each item's answer in order (a new execution, a
    # replay of the same dedup key by the item before it, a refused item), counted above them;
    # what is not a JSON array is refused before anything is sent. In a tenant of its own, so
    # acme's totals below stay as they are.
    check(api.call("PUT", "/api/tenants/batched", {})[0] in (200, 201), "tenant batched registered")
    ui.go("#/t/batched/executions")
    ui.click("#new-batch")
    ui.type("#batch-items", '{"flow_id": "demo.echo"}')
    ui.click("#batch-submit")
    ui.sees(lambda: "must be a JSON array" in ui.text("#batch-error"), "a batch that is not an array: refused in the page")
    total = api.call("GET", "/api/executions", tenant="batched")[1]["total"]
    ui.type("#batch-items", '[{"flow_id": "demo.echo", "dedup_key": "batch-1"}, '
            '{"flow_id": "demo.echo", "dedup_key": "batch-1"}, {"flow_id": ""}]')
    ui.click("#batch-submit")
    ui.el("#batch-summary", "the batch's answer")
    check((ui.attr("#batch-summary", "data-admitted"), ui.attr("#batch-summary", "data-replayed"),
           ui.attr("#batch-summary", "data-refused")) == ("1", "1", "1")
          and "1 admitted, 1 replayed, 1 not admitted" in ui.text("#batch-summary"),
          f"the batch counted: {ui.text('#batch-summary')}")
    items = ui.d.find_elements(By.CSS_SELECTOR, "#batch-results .batch-item")
    check([i.get_attribute("data-status") for i in items] == ["201", "200", "400"],
          "one row per item, in order: 201, 200 (replay), 400")
    linked = [i.find_element(By.CSS_SELECTOR, "a.exec-link").get_attribute("data-id") for i in items[:2]]
    check(linked[0] == linked[1] and "replay" in items[1].text, "the replay names the execution the item before it made")
    check("invalid_flow_id" in items[2].text, f"the refused item shows its problem ({items[2].text})")
    status, listed = api.call("GET", "/api/executions?dedup_key=batch-1", tenant="batched")
    check(status == 200 and [e["execution_id"] for e in listed["executions"]] == [linked[0]]
          and api.call("GET", "/api/executions", tenant="batched")[1]["total"] == total + 1,
          "the API holds exactly the one execution the batch made")
    no_errors(ui, "batch")

    # --- A concurrency key from the form: sent, listed and on the detail page.
    ui.go("#/t/acme/executions")
    keyed = ui.admitted_id("demo.sleep", '{"ms": 50}', ckey="customer 7/é")
    check("concurrency key customer 7/é" in ui.text("#admit-created"),
          f"the admission names its concurrency key ({ui.text('#admit-created')})")
    check(api.call("GET", f"/api/executions/{keyed}", tenant="acme")[1]["concurrency_key"] == "customer 7/é",
          "the API holds the concurrency key given in the form")
    ui.sees(lambda: ui.text(f'#executions-body tr[data-id="{keyed}"] .ckey') == "customer 7/é",
            "the list shows the row's concurrency key")
    check(ui.text(f'#executions-body tr[data-id="{first}"] .ckey') == "", "a row without a key shows none")
    ui.go(f"#/t/acme/executions/{keyed}")
    ui.sees(lambda: ui.text("#detail-concurrency-key") == "customer 7/é", "the detail shows the concurrency key")
    check(ui.text("#detail-trace") == "—", "no trace context: the detail says none")
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    # Scheduled an hour ahead and cancelled once seen, so no later count of the test includes it.
    status, traced = api.call("POST", "/api/executions", {"flow_id": "demo.echo", "delay": "1h"},
                              tenant="acme", headers={"traceparent": tp, "tracestate": "congo=t61rcWkgMzE"})
    check(status == 201 and traced["traceparent"] == tp, "admitted through the API with a traceparent")
    ui.go(f"#/t/acme/executions/{traced['execution_id']}")
    ui.sees(lambda: tp in ui.text("#detail-trace") and "congo=t61rcWkgMzE" in ui.text("#detail-trace"),
            "the detail shows its trace context")
    check(api.call("POST", f"/api/executions/{traced['execution_id']}/cancel", tenant="acme")[0] == 200,
          "the traced execution is cancelled")
    ui.go("#/t/acme/executions")
    res = ui.admit("demo.sleep", ckey="x" * 129)
    check(res.get_attribute("id") == "admit-error" and "invalid_concurrency_key" in res.text,
          f"a key of 129 bytes: the API's 400 shown ({res.text})")
    no_errors(ui, "concurrency key in the form")

    # --- A demo.sleep row turns from running to completed without a reload.
    ui.go("#/t/acme/executions")
    sleeper = ui.admitted_id("demo.sleep", '{"ms": 4000}')
    ui.until(lambda: ui.row_status(sleeper) == "running", "the demo.sleep row running", 15)
    ui.until(lambda: ui.row_status(sleeper) == "completed", "the demo.sleep row completed", 15)
    check(ui.d.execute_script("return window.__noReload") == "still here", "running -> completed without a reload")

    # --- Auto-refresh pauses while the tab is hidden (the page is told so, as a browser
    # would), and reloads at once when it is visible again.
    ui.d.execute_script("""
        window.__hidden = true;
        Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => window.__hidden ? 'hidden' : 'visible'});
        document.dispatchEvent(new Event('visibilitychange'));""")
    ui.until(lambda: ui.text("#refresh-state") == "paused while hidden", "auto-refresh paused")
    hidden_since = time.monotonic()
    try:
        # Two refresh intervals and a half: a refresh would have shown "updated ...".
        WebDriverWait(ui.d, 5, poll_frequency=0.1).until(lambda d: ui.text("#refresh-state") != "paused while hidden")
        raise Failed("the list refreshed while the tab was hidden")
    except TimeoutException:
        check(time.monotonic() - hidden_since >= 5, "no refresh while the tab is hidden")
    ui.d.execute_script("window.__hidden = false; document.dispatchEvent(new Event('visibilitychange'))")
    ui.until(lambda: ui.text("#refresh-state").startswith("updated"), "refreshed at once when visible again", 2)

    # --- The detail page is live (SSE): queued/running -> completed, no reload.
    live = ui.admitted_id("demo.sleep", '{"ms": 3000}')
    ui.go(f"#/t/acme/executions/{live}")
    ui.until(lambda: ui.text("#detail-status") == "running", "detail shows running")
    ui.el("#live", "the live marker")
    shot("execution.png")
    ui.until(lambda: ui.text("#detail-status") == "completed", "detail turns completed by itself", 15)
    check(ui.d.execute_script("return window.__noReload") == "still here", "the detail page followed it live")
    check("running" in ui.text("#seen-live"), "the changes seen live are in the timeline")

    # --- Cancel, retry, force delete on the detail page.
    ui.go("#/t/acme/executions")
    long_one = ui.admitted_id("demo.sleep", '{"ms": 60000}')
    ui.go(f"#/t/acme/executions/{long_one}")
    ui.until(lambda: ui.text("#detail-status") == "running", "the long sleep running")
    ui.click("#action-cancel")
    ui.until(lambda: ui.text("#detail-status") == "cancelled", "cancelled after Cancel")
    ui.click("#action-retry")
    ui.until(lambda: ui.text("#detail-status") in ("queued", "running"), "queued again after Retry")
    check(ui.text("#detail-attempt").startswith(("0 ", "1 ")), "a retry starts over at attempt 0")
    ui.click("#action-force-delete")
    ui.el("#confirm-input")
    ui.type("#confirm-input", "wrong")
    check(ui.el("#confirm-ok").get_attribute("disabled") is not None, "force delete waits for the typed id")
    ui.confirm(long_one[:8])
    ui.el("#executions-table", "back on the list after the delete")
    check(api.call("GET", f"/api/executions/{long_one}", tenant="acme")[0] == 404, "force-deleted: 404")
    no_errors(ui, "cancel, retry, force delete")

    # --- Bulk cancel and retry of selected rows.
    bulk = [ui.admitted_id("demo.sleep", '{"ms": 60000}') for _ in range(2)]
    for b in bulk:
        ui.until(lambda: ui.row_status(b) is not None, "bulk row listed")
        ui.click(f'#executions-body tr[data-id="{b}"] .row-select')
    ui.click("#bulk-cancel")
    ui.until(lambda: all(ui.row_status(b) == "cancelled" for b in bulk), "both selected rows cancelled")
    for b in bulk:
        ui.click(f'#executions-body tr[data-id="{b}"] .row-select')
    ui.click("#bulk-retry")
    ui.until(lambda: all(ui.row_status(b) in ("queued", "running") for b in bulk), "both selected rows queued again")
    for b in bulk:
        api.call("POST", f"/api/executions/{b}/cancel", tenant="acme")

    # --- Priority and schedule: admitted from the form with priority 1 and a delay, listed as
    # scheduled with its due time; another at a date-time; the API's refusals shown.
    before = time.time()
    later = ui.admitted_id("demo.sleep", '{"ms": 300}', priority=1, delay="10m")
    after = time.time()
    check("scheduled" in ui.text("#admit-created") and "priority 1" in ui.text("#admit-created"),
          f"the form says scheduled, priority 1 ({ui.text('#admit-created')})")
    e = api.call("GET", f"/api/executions/{later}", tenant="acme")[1]
    due = parse_time(e["run_at"]).timestamp()
    check(e["priority"] == 1 and e["status"] == "queued" and e["queue_state"] == "scheduled"
          and before + 600 - 2 <= due <= after + 600 + 2,
          f"the API holds priority 1, scheduled, due in 10 min ({e['run_at']})")
    row = f'#executions-body tr[data-id="{later}"]'
    ui.sees(lambda: ui.present(row), "the scheduled row listed")
    check(ui.attr(row, "data-queue-state") == "scheduled" and "scheduled" in ui.text(f"{row} .status"),
          "the row is queued · scheduled")
    check(ui.text(f"{row} .priority") == "1", "the row shows priority 1")
    check(ui.text(f"{row} .due .due-time") == shown_time(e["run_at"]) and "in 10 min" in ui.text(f"{row} .due"),
          f"the row's Due column: {ui.text(f'{row} .due')}")
    at = datetime.datetime.now().replace(microsecond=0) + datetime.timedelta(hours=2)
    far = ui.admitted_id("demo.sleep", '{"ms": 300}', priority=5, run_at=local_input(at))
    e = api.call("GET", f"/api/executions/{far}", tenant="acme")[1]
    check(parse_time(e["run_at"]) == at.astimezone(datetime.timezone.utc) and e["priority"] == 5
          and e["queue_state"] == "scheduled",
          f"a start at a local date-time is sent as that moment in UTC ({e['run_at']})")
    res = ui.admit("demo.sleep", "{}", delay="soon")
    check(res.get_attribute("id") == "admit-error" and "invalid_delay" in res.text, f"a bad delay: the API's 400 shown ({res.text})")
    next_year = (datetime.datetime.now() + datetime.timedelta(days=400)).replace(microsecond=0)
    res = ui.admit("demo.sleep", "{}", run_at=local_input(next_year))
    check(res.get_attribute("id") == "admit-error" and "invalid_run_at" in res.text,
          f"more than a year ahead: the API's 400 shown ({res.text})")
    Select(ui.el("#admit-when")).select_by_value("now")
    no_errors(ui, "schedule in the form")

    # --- The scheduled filter, in the URL: only scheduled executions, surviving a reload.
    ui.clear_toasts()
    ui.click("#filter-scheduled")
    check(not ui.el('#filter-status option[value="running"]').is_enabled(),
          "with scheduled only, a status other than queued cannot be picked")
    ui.click("#filter-apply")
    ui.sees(lambda: "queue=scheduled" in ui.d.current_url, "the scheduled filter in the URL")
    want = api.call("GET", "/api/executions?queue_state=scheduled", tenant="acme")[1]

    def scheduled_listed():
        ids = [r.get_attribute("data-id") for r in ui.d.find_elements(By.CSS_SELECTOR, "#executions-body tr[data-id]")]
        states = {r.get_attribute("data-queue-state") for r in ui.d.find_elements(By.CSS_SELECTOR, "#executions-body tr[data-id]")}
        return ids if states == {"scheduled"} and ui.el("#total").get_attribute("data-total") == str(want["total"]) else None
    ids = ui.until(scheduled_listed, "the scheduled executions only")
    check(set(ids) == {x["execution_id"] for x in want["executions"]} and {later, far} <= set(ids) and first not in ids,
          f"the filter lists the {len(ids)} scheduled executions, and not the others")
    ui.d.refresh()
    ui.sees(lambda: scheduled_listed() == ids and ui.el("#filter-scheduled").is_selected(), "the scheduled filter survives a reload")
    shot("executions-scheduled.png")
    ui.click("#filter-reset")
    ui.until(lambda: "queue=" not in ui.d.current_url and not ui.el("#filter-scheduled").is_selected(), "the filter reset")

    # --- Reschedule from the detail page: to a nearer date-time, then to now (it runs).
    ui.go(f"#/t/acme/executions/{later}")
    ui.until(lambda: ui.text("#detail-queue-state") == "scheduled", "the detail says scheduled")
    old = api.call("GET", f"/api/executions/{later}", tenant="acme")[1]["run_at"]
    check(ui.text("#detail-priority").startswith("1") and ui.text("#detail-run-at .due-time") == shown_time(old),
          "the detail shows priority 1 and its due time")
    ui.el("#reschedule-form", "the reschedule control")
    ui.start("reschedule", "whenever", None, now=False)
    ui.click("#action-reschedule")
    ui.sees(lambda: any("Reschedule refused" in t.text and "delay must be" in t.text
                         for t in ui.d.find_elements(By.CSS_SELECTOR, ".toast.error")), "a bad delay: refused, the API's reason shown")
    nearer = datetime.datetime.now().replace(microsecond=0) + datetime.timedelta(minutes=3)
    ui.clear_toasts()
    ui.start("reschedule", None, local_input(nearer), now=False)
    ui.click("#action-reschedule")
    ui.sees(lambda: ui.el("#detail-run-at").get_attribute("data-run-at") != old, "the due time moved on the page")
    new = api.call("GET", f"/api/executions/{later}", tenant="acme")[1]
    check(parse_time(new["run_at"]) == nearer.astimezone(datetime.timezone.utc) and parse_time(new["run_at"]) < parse_time(old)
          and new["queue_state"] == "scheduled", f"rescheduled to the nearer time ({old} -> {new['run_at']})")
    check(ui.text("#detail-run-at .due-time") == shown_time(new["run_at"]) and "in 3 min" in ui.text("#detail-run-at"),
          f"the detail shows the new due time ({ui.text('#detail-run-at')})")
    shot("reschedule.png")
    ui.start("reschedule", "0s", None, now=False)
    ui.click("#action-reschedule")
    ui.sees(lambda: ui.text("#detail-status") == "completed", "rescheduled to now: it ran and completed, seen live", 15)
    check(not ui.present("#reschedule-form"), "no reschedule control once it is not scheduled")
    status, problem = api.call("POST", f"/api/executions/{later}/reschedule", {"delay": "1m"}, tenant="acme")
    check(status == 409 and problem["code"] == "not_scheduled", "the API refuses to reschedule it now (409 not_scheduled)")
    api.call("POST", f"/api/executions/{far}/cancel", tenant="acme")
    no_errors(ui, "reschedule")

    # --- A tenant's weight, set on the tenants page and read back.
    ui.go("#/tenants")
    acme = 'tr[data-tenant="acme"]'
    check(ui.attr(f"{acme} .edit-weight", "value") == "1", "acme's weight is the default, 1")
    check("scheduled" in ui.text(f"{acme} .usage"), f"the usage shows running, waiting and scheduled ({ui.text(f'{acme} .usage')})")
    ui.type(f"{acme} .edit-weight", "0")
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: any("Not saved" in t.text and "weight" in t.text for t in ui.d.find_elements(By.CSS_SELECTOR, ".toast.error")),
             "weight 0: the API's refusal shown")
    ui.clear_toasts()
    ui.type(f"{acme} .edit-weight", "3")
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: api.call("GET", "/api/tenants/acme")[1]["weight"] == 3, "weight 3 saved from the tenants page")
    ui.d.refresh()
    ui.sees(lambda: ui.el(f"{acme} .edit-weight").get_attribute("value") == "3", "acme's weight reads 3 after a reload")
    ui.type("#new-tenant-id", "heavy")
    ui.type("#new-tenant-weight", "40")
    ui.click("#register-submit")
    ui.sees(lambda: ui.present('#tenants-body tr[data-tenant="heavy"]')
             and ui.el('tr[data-tenant="heavy"] .edit-weight').get_attribute("value") == "40", "heavy registered with weight 40")
    check(api.call("GET", "/api/tenants/heavy")[1]["weight"] == 40, "the API holds heavy's weight 40")
    ui.el(f"{acme} .edit-weight").clear()
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: api.call("GET", "/api/tenants/acme")[1]["weight"] == 1, "an empty weight restores the default, 1")
    ui.until(lambda: ui.attr(f"{acme} .edit-weight", "value") == "1", "the tenants read again after the save")
    no_errors(ui, "weight")

    # --- max_concurrent_per_key, set on the tenants page and read back.
    check(ui.attr(f"{acme} .edit-max-per-key", "value") == "", "acme has no per-key limit at first")
    check(ui.text(f"{acme} .ckey-counts") == "0 overrides, 0 blocked",
          f"acme's concurrency keys: none overridden, none blocked ({ui.text(f'{acme} .ckey-counts')})")
    ui.type(f"{acme} .edit-max-per-key", "0")
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: any("Not saved" in t.text and "max_concurrent_per_key must be at least 1" in t.text
                         for t in ui.d.find_elements(By.CSS_SELECTOR, ".toast.error")),
             "max_concurrent_per_key 0: the API's refusal shown")
    ui.clear_toasts()
    ui.type(f"{acme} .edit-max-per-key", "2")
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: api.call("GET", "/api/tenants/acme")[1]["max_concurrent_per_key"] == 2,
            "max_concurrent_per_key 2 saved from the tenants page")
    ui.d.refresh()
    ui.sees(lambda: ui.attr(f"{acme} .edit-max-per-key", "value") == "2", "acme's max_concurrent_per_key reads 2 after a reload")

    # --- A concurrency key's override: set from the form, listed with its limit, edited to
    # hold the key (an execution of it waits: the key is blocked), deleted (it runs).
    ui.click(f"{acme} .show-ckeys")
    ui.sees(lambda: "keys=acme" in ui.d.current_url and ui.present("#no-ckeys"), "acme's concurrency keys open: no override")
    check("at most 2 at once" in ui.text("#ckeys-default"), f"the per-key default is named ({ui.text('#ckeys-default')})")
    ui.type("#ckey-name", "k" * 129)
    ui.type("#ckey-max-concurrent", "3")
    ui.click("#set-ckey-submit")
    ui.sees(lambda: any("Not saved" in t.text and "concurrency key must be 1-128 bytes" in t.text
                         for t in ui.d.find_elements(By.CSS_SELECTOR, ".toast.error")),
             "a key of 129 bytes: the API's reason shown")
    ui.clear_toasts()
    key = "customer 7/é"
    key_path = f"/api/tenants/acme/concurrency-keys/{urllib.parse.quote(key, safe='')}"
    ui.type("#ckey-name", key)
    ui.type("#ckey-max-concurrent", "3")
    ui.click("#set-ckey-submit")
    krow = f'#ckeys-body tr[data-key="{key}"]'
    ui.sees(lambda: ui.present(krow) and ui.attr(f"{krow} .ckey-limit", "data-limit") == "3",
            "the override listed with its limit, 3")
    check(ui.text(f"{krow} .ckey") == key and ui.text(f"{krow} .ckey-limit") == "3"
          and ui.text(f"{krow} .ckey-running") == "0" and ui.text(f"{krow} .ckey-queued") == "0",
          "its row: key, limit 3, running 0, queued 0")
    status, k = api.call("GET", key_path)
    check(status == 200 and k["max_concurrent"] == 3 and k["override"] is True, f"the API holds the override ({k})")
    ui.sees(lambda: ui.text(f"{acme} .ckey-counts") == "1 override, 0 blocked", "acme counts one override")
    ui.clear_toasts()
    ui.click(f"{krow} .edit-ckey")
    check(ui.attr("#ckey-name", "value") == key and ui.attr("#ckey-max-concurrent", "value") == "3",
          "Edit puts the key and its limit in the form")
    ui.type("#ckey-max-concurrent", "0")
    ui.click("#set-ckey-submit")
    ui.sees(lambda: ui.attr(f"{krow} .ckey-limit", "data-limit") == "0" and ui.text(f"{krow} .ckey-limit") == "0 (held)",
            "the key held: limit 0")
    status, held = api.call("POST", "/api/executions", {"flow_id": "demo.sleep", "params": {"ms": 50}, "concurrency_key": key},
                            tenant="acme")
    check(status == 201 and held["concurrency_key"] == key, "an execution of the held key admitted")
    ui.d.refresh()
    ui.sees(lambda: ui.text(f"{krow} .ckey-queued") == "1" and ui.text(f"{acme} .ckey-counts") == "1 override, 1 blocked",
            "the held key's execution waits: queued 1, the key counted blocked")
    check(api.call("GET", f"/api/executions/{held['execution_id']}", tenant="acme")[1]["status"] == "queued",
          "the held key's execution has not started")
    ui.clear_toasts()
    ui.click(f"{krow} .delete-ckey")
    ui.confirm()
    ui.sees(lambda: not ui.present(krow) and ui.present("#no-ckeys"), "the deleted override is no longer listed")
    status, k = api.call("GET", key_path)
    check(status == 200 and k["override"] is False and k["max_concurrent"] == 2,
          f"the API: no override, the per-key default applies ({k})")
    ui.until(lambda: api.call("GET", f"/api/executions/{held['execution_id']}", tenant="acme")[1]["status"] == "completed",
             "the key's execution ran once the hold was gone")
    ui.el(f"{acme} .edit-max-per-key").clear()
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: api.call("GET", "/api/tenants/acme")[1]["max_concurrent_per_key"] is None,
            "an empty max_concurrent_per_key removes the per-key limit")
    ui.sees(lambda: "no limit of its own" in ui.text("#ckeys-default"), "the keys section says keys have no limit now")
    ui.click("#ckeys-close")
    ui.gone("#concurrency-keys", "the keys section closed")
    no_errors(ui, "concurrency keys")

    # --- Rate limits, set on the tenants page (the period read back normalized), shown after
    # a reload, an invalid one refused with the API's reason, then both removed.
    check(ui.text(f"{acme} .rate-limit") == "—" and ui.text(f"{acme} .rate-limit-per-key") == "—",
          "acme has no rate limit at first")
    ui.clear_toasts()
    ui.click(f"{acme} .edit-rates")
    ui.type(f"{acme} .edit-rate-starts", "100")
    ui.type(f"{acme} .edit-rate-per", "60s")
    ui.type(f"{acme} .edit-rate-burst", "10")
    ui.type(f"{acme} .edit-key-rate-starts", "5")
    ui.type(f"{acme} .edit-key-rate-per", "500ms")
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: api.call("GET", "/api/tenants/acme")[1]["rate_limit"] == {"starts": 100, "per": "1m", "burst": 10},
            "rate_limit 100 per 60s, burst 10 saved from the tenants page (read back as per 1m)")
    check(api.call("GET", "/api/tenants/acme")[1]["rate_limit_per_key"] == {"starts": 5, "per": "500ms", "burst": 1},
          "rate_limit_per_key 5 per 500ms saved, burst left empty: 1")
    ui.d.refresh()
    ui.sees(lambda: ui.text(f"{acme} .rate-limit") == "100 / 1m, burst 10"
            and ui.text(f"{acme} .rate-limit-per-key") == "5 / 500ms, burst 1",
            "acme's rate limits read on the page after a reload")
    ui.click(f"{acme} .edit-rates")
    check(ui.attr(f"{acme} .edit-rate-per", "value") == "1m" and ui.attr(f"{acme} .edit-key-rate-burst", "value") == "1",
          "the edit boxes hold the rate limits read back")
    ui.type(f"{acme} .edit-rate-starts", "0")
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: any("Not saved" in t.text and "rate_limit: starts must be from 1" in t.text
                         for t in ui.d.find_elements(By.CSS_SELECTOR, ".toast.error")),
            "a rate limit of 0 starts: the API's refusal shown")
    check(api.call("GET", "/api/tenants/acme")[1]["rate_limit"]["starts"] == 100, "the refused rate limit changed nothing")
    ui.clear_toasts()
    for box in ("rate-starts", "rate-per", "rate-burst", "key-rate-starts", "key-rate-per", "key-rate-burst"):
        ui.el(f"{acme} .edit-{box}").clear()
    ui.click(f"{acme} .save-tenant")
    ui.sees(lambda: (lambda t: t["rate_limit"] is None and t["rate_limit_per_key"] is None)(api.call("GET", "/api/tenants/acme")[1]),
            "empty rate limit boxes remove both rate limits")
    ui.sees(lambda: ui.text(f"{acme} .rate-limit") == "—" and ui.text(f"{acme} .rate-limit-per-key") == "—",
            "the page shows no rate limit again")
    no_errors(ui, "rate limits")
    ui.go("#/t/acme/executions")
    within_deadline()

    # --- Filters in the URL, surviving a reload; the time range; jump to an id.
    Select(ui.el("#filter-status")).select_by_value("completed")
    ui.type("#filter-flow", "demo.echo")
    ui.click("#filter-apply")
    ui.until(lambda: "status=completed" in ui.d.current_url and "flow=demo.echo" in ui.d.current_url, "filters in the URL")
    ui.d.refresh()
    ui.until(lambda: ui.row_status(first) == "completed", "the filtered list after a reload")
    check(Select(ui.el("#filter-status")).first_selected_option.get_attribute("value") == "completed"
          and ui.el("#filter-flow").get_attribute("value") == "demo.echo"
          and ui.el("#total").get_attribute("data-total") == "1", "the filters survive a reload (total 1)")
    ui.go("#/t/acme/executions?dedup=order-1")
    ui.until(lambda: ui.el("#total").get_attribute("data-total") == "1" and ui.row_status(first), "the dedup key filter")
    ui.go("#/t/acme/executions?from=2999-01-01T00%3A00%3A00.000Z")
    ui.until(lambda: ui.el("#total").get_attribute("data-total") == "0", "a time range in the future matches nothing")
    ui.el("#no-executions")
    ui.go("#/t/acme/executions?from=2000-01-01T00%3A00%3A00.000Z&before=2999-01-01T00%3A00%3A00.000Z")
    ui.until(lambda: ui.row_status(first), "a wide time range matches")
    ui.type("#jump-input", first + Keys.ENTER)
    ui.until(lambda: ui.present("#detail-status") and first in ui.d.current_url, "jump to an id opens its detail")
    no_errors(ui, "filters")

    # --- A dead letter: replayed, then dismissed.
    ui.go("#/t/acme/executions")
    failing = ui.admitted_id("demo.fail", '{"message": "boom <b>bold</b>"}')
    ui.until(lambda: ui.row_status(failing) == "failed", "demo.fail failed after its attempts", 20)
    ui.go("#/t/acme/dead-letters")
    rec = f'#dead-letters-body tr[data-execution="{failing}"]'
    ui.el(rec, "its dead letter listed")
    check("handler_error" in ui.text(f"{rec} .reason") and "<b>bold</b>" in ui.text(f"{rec} .message"),
          "the dead letter shows its reason, the message as text")
    check("of at most 1000 records kept; 0 evicted" in ui.text("#dead-letters-kept"),
          "the page says how many records the tenant keeps, of its cap, and evictions")
    shot("dead-letters.png")
    ui.go(f"#/t/acme/executions/{failing}")
    ui.el("#detail-dead-letters", "the execution's page lists its dead letter")
    check("handler_error" in ui.text("#detail-dead-letters") and "boom" in ui.text("#detail-error"),
          "the failed execution shows its error and dead letter")
    ui.go("#/t/acme/dead-letters")
    ui.click(f"{rec} .row-select")
    ui.click("#dlq-replay")
    ui.until(lambda: any("Replayed 1 of 1" in t.text for t in ui.d.find_elements(By.CSS_SELECTOR, ".toast")),
             "the replay is confirmed")
    ui.until(lambda: api.call("GET", f"/api/executions/{failing}", tenant="acme")[1]["status"] == "failed"
             and len([d for d in api.call("GET", "/api/dlq", tenant="acme")[1]["dead_letters"] if d["execution_id"] == failing]) == 2,
             "the replay failed again: a second dead letter", 20)
    ui.d.refresh()
    ui.until(lambda: len(ui.d.find_elements(By.CSS_SELECTOR, rec)) == 2, "two dead letters listed")
    for box in ui.d.find_elements(By.CSS_SELECTOR, f"{rec} .row-select"):
        box.click()
    ui.click("#dlq-dismiss")
    ui.el("#no-dead-letters", "the dismissed records are gone")
    check(api.call("GET", "/api/dlq", tenant="acme")[1]["dead_letters"] == [], "the API lists no dead letter either")
    check(api.call("GET", f"/api/executions/{failing}", tenant="acme")[1]["status"] == "failed",
          "dismissing left the execution failed")
    no_errors(ui, "dead letters")

    # --- Limits edited, and their effect: a full queue (429), then a waiting one started.
    def idle():
        usage = api.call("GET", "/api/tenants/acme")[1]["usage"]
        return usage["running"] + usage["waiting"] + usage["scheduled"] == 0
    ui.until(idle, "acme holds no slot (the cancelled runs have stopped)")
    ui.go("#/tenants")
    ui.type(f"{acme} .edit-max-concurrent", "1")
    ui.type(f"{acme} .edit-max-queued", "1")
    ui.click(f"{acme} .save-tenant")
    ui.until(lambda: api.call("GET", "/api/tenants/acme")[1]["max_concurrent"] == 1, "max_concurrent 1 saved")
    ui.go("#/t/acme/executions")
    a = ui.admitted_id("demo.sleep", '{"ms": 60000}')
    # max_queued counts queued executions: the first must have started before the second
    # queues, or the second would be the one refused.
    ui.until(lambda: api.call("GET", f"/api/executions/{a}", tenant="acme")[1]["status"] == "running",
             "the first one started")
    b = ui.admitted_id("demo.sleep", '{"ms": 60000}')
    res = ui.admit("demo.sleep", '{"ms": 60000}')
    # Retry-After comes from the tenant's measured start rate: 1 s to an hour.
    after = re.search(r"retry after (\d+) s", res.text)
    check(res.get_attribute("id") == "admit-queue-full" and after is not None
          and 1 <= int(after.group(1)) <= 3600,
          f"the third admission: 429 with its Retry-After ({res.text})")
    ui.until(lambda: ui.row_status(a) == "running" and ui.row_status(b) == "queued", "one running, one waiting")
    check("waiting" in ui.text(f'#executions-body tr[data-id="{b}"] .status'), "the second one waits for a slot")
    ui.sees(lambda: ui.text(f'#executions-body tr[data-id="{b}"] .queue-pos') == "next",
            "the list shows the waiting one is next in its tenant")
    shot("executions.png")
    res = ui.admit("demo.sleep", '{"ms": 60000}', dry_run=True)
    check(res.get_attribute("data-decision") == "refuse" and res.get_attribute("data-reason") == "tenant_queue_full"
          and 0 <= int(ui.text("#admit-dry-run .dry-retry-after")) <= 3600,
          f"a dry run with the queue full: refuse, with its retry after ({res.text})")
    # The waiting one's detail page: its place (nothing before it) and when it should start
    # (acme's start rate has been measured by now).
    ui.go(f"#/t/acme/executions/{b}")
    ui.sees(lambda: ui.attr("#detail-position", "data-tenant") == "0" and ui.attr("#detail-position", "data-key") == ""
            and ui.text("#detail-position .position") == "next in the tenant",
            "the detail page: the waiting one is next in the tenant")
    p50, p90 = ui.attr("#detail-eta", "data-p50"), ui.attr("#detail-eta", "data-p90")
    eta = ui.text("#detail-eta")
    check(parse_time(p50) <= parse_time(p90) and f"expected to start ~{shown_time(p50)} (90 %: {shown_time(p90)})" in eta,
          f"the detail page: its expected start, as the page shows times ({eta})")
    # A tenant nobody registered (as every tenant of `sluice dev` is) with work of its own.
    status, walk_in = api.call("POST", "/api/executions", {"flow_id": "demo.sleep", "params": {"ms": 60000}},
                               tenant="walk-in")
    check(status == 201, "an unregistered tenant admits")
    ui.go("#/overview")
    ui.until(lambda: "1 / 1" in ui.text('#saturation-body tr[data-tenant="acme"] .slots')
             and "1 / 1" in ui.text('#saturation-body tr[data-tenant="acme"] .queue'), "saturation: 1/1 slots, 1/1 waiting")
    work = '#work-body tr[data-tenant="{}"]'
    ui.until(lambda: ui.text(work.format("acme") + " .queued") == "1" and ui.text(work.format("acme") + " .running") == "1",
             "tenants with work now: acme, 1 queued and 1 running")
    ui.until(lambda: ui.text(work.format("walk-in") + " .registered") == "no"
             and ui.text(work.format("walk-in") + " .running") == "1",
             "tenants with work now: the unregistered walk-in tenant, running")
    check(not ui.d.find_element(By.CSS_SELECTOR, "#shards-table").is_displayed(), "the per-shard table is folded away")
    ui.click("#shard-details summary")
    ui.el("#shards-table", "the per-shard table unfolds")
    ui.until(lambda: len(ui.d.find_elements(By.CSS_SELECTOR, "#shards-body tr")) == 18, "every shard has a row")
    ui.click("#shard-details summary")
    shot("overview.png")
    api.call("POST", f"/api/executions/{walk_in['execution_id']}/cancel", tenant="walk-in")
    ui.until(lambda: ui.present("#work-body") and not ui.present(work.format("walk-in")),
             "a tenant whose work is done leaves the list")
    ui.go("#/tenants")
    ui.type(f"{acme} .edit-max-concurrent", "2")
    ui.click(f"{acme} .save-tenant")
    ui.go("#/t/acme/executions")
    ui.until(lambda: ui.row_status(b) == "running", "raising max_concurrent started the waiting one")
    check(not ui.present(f'#executions-body tr[data-id="{b}"] .queue-pos'), "a running row shows no place in the queue")
    ui.go(f"#/t/acme/executions/{b}")
    ui.sees(lambda: ui.text("#detail-status") == "running" and not ui.present("#detail-position"),
            "its detail page: running, no place in the queue any more")
    for x in (a, b):
        api.call("POST", f"/api/executions/{x}/cancel", tenant="acme")
    ui.go("#/tenants")
    ui.el(f"#tenants-body {acme}")
    shot("tenants.png")
    ui.click(f"{acme} .edit-enabled")
    ui.click(f"{acme} .save-tenant")
    ui.until(lambda: api.call("GET", "/api/tenants/acme")[1]["enabled"] is False, "acme disabled")
    ui.go("#/t/acme/executions")
    res = ui.admit("demo.echo")
    check(res.get_attribute("id") == "admit-error" and "tenant_disabled" in res.text,
          "a disabled tenant's admission is refused in the form")
    ui.go("#/tenants")
    ui.click(f"{acme} .edit-enabled")
    ui.click(f"{acme} .save-tenant")
    ui.until(lambda: api.call("GET", "/api/tenants/acme")[1]["enabled"] is True, "acme enabled again")
    no_errors(ui, "limits")
    within_deadline()

    # --- Trends: a chart reflects what was admitted and completed.
    charted = []
    for _ in range(3):
        status, e = api.call("POST", "/api/executions", {"flow_id": "demo.echo"}, tenant="charted")
        check(status == 201, "charted: admitted")
        charted.append(e["execution_id"])
    ui.until(lambda: all(api.call("GET", f"/api/executions/{x}", tenant="charted")[1]["status"] == "completed"
                         for x in charted), "charted: all three completed")
    ui.go("#/t/charted/trends")
    chart = "#tenant-activity"

    def chart_says(name, want):
        return ui.el(chart).get_attribute(f"data-total-{name}") == str(want)
    ui.until(lambda: chart_says("admissions", 3) and chart_says("starts", 3) and chart_says("completions", 3)
             and chart_says("failures", 0), "the tenant's chart totals: 3 admitted, started and completed")
    check("3 admitted, 3 started, 3 completed, 0 failed" in ui.text(f"{chart} figcaption"),
          "the chart's caption says so")
    drawn = ui.d.execute_script(
        "return [...document.querySelectorAll('#tenant-activity svg path.line-starts')].map((p) => p.getAttribute('d'))")
    check(len(drawn) == 1 and drawn[0].count("L") >= 1 and drawn[0] != "M0 0", "the starts line is drawn as SVG")
    ui.el("#tenant-wait", "the waiting-time chart")
    check(ui.el("#tenant-wait").get_attribute("data-total-p99") not in (None, ""), "a p99 waiting time for the starts")
    shot("trends.png")
    # The overview sums every tenant: its chart agrees with the API.
    ui.go("#/overview")
    ui.until(lambda: ui.el("#overview-activity").get_attribute("data-total-completions")
             == str(api.call("GET", "/api/trends")[1]["series"]["totals"]["completions"]),
             "the overview's completions total is the API's")
    check(int(ui.el("#overview-activity").get_attribute("data-total-completions")) >= 3,
          "the overview counts charted's completions")
    no_errors(ui, "trends")

    # --- A tenant's webhook, from its page: none at first; a bad address refused with the
    # API's reason; a receiver on loopback set, the secret shown once; an execution's end
    # delivered to it, signed, and in the page's delivery log; saved again (secret kept), then
    # rotated (a new one); removed after a confirmation.
    check(api.call("PUT", "/api/tenants/hooked", {})[0] in (200, 201), "tenant hooked registered")
    with Receiver() as receiver:
        ui.go("#/t/hooked/executions")
        ui.click("#nav-webhook")
        ui.sees(lambda: ui.present("#no-webhook") and ui.shown("#webhook-form"), "the webhook page: no webhook yet")
        check(not ui.present("#webhook-remove") and not ui.shown("#webhook-rotate") and not ui.shown("#webhook-error"),
              "no webhook: nothing to remove, no secret to rotate, no error")
        ui.type("#webhook-url-input", "ftp://example.com/x")
        ui.click("#webhook-submit")
        ui.sees(lambda: ui.shown("#webhook-error") and "must start with https:// or http://" in ui.text("#webhook-error"),
                "ftp refused: the API's detail shown beside the form")
        check(api.call("GET", "/api/tenants/hooked/webhook")[1]["code"] == "webhook_not_found" and ui.present("#no-webhook"),
              "the refused address set nothing")
        hook = f"http://127.0.0.1:{receiver.port}/hook"
        ui.type("#webhook-url-input", hook)
        ui.click("#webhook-submit")
        secret = ui.el("#webhook-secret", "the new secret").get_attribute("value")
        check(secret.startswith("whsec_") and "shown only now" in ui.text("#webhook-secret-box"),
              "the receiver's address set: its secret shown once, whsec_...")
        ui.sees(lambda: ui.text("#webhook-url") == hook and not ui.shown("#webhook-error"),
                "the page shows the address, and no error any more")
        check(all(ui.attr(f"#webhook-{n}", "data-count") == "0" for n in ("pending", "delivered", "failed", "dropped"))
              and ui.text("#webhook-last-delivered") == "—", "nothing pending, delivered, failed or dropped yet")
        status, got = api.call("GET", "/api/tenants/hooked/webhook")
        check(status == 200 and got["url"] == hook and "secret" not in got, "the API holds the address, and never shows the secret")
        shot("webhook.png")

        status, e = api.call("POST", "/api/executions", {"flow_id": "demo.echo", "params": {"n": 1}}, tenant="hooked")
        check(status == 201, "hooked: a demo.echo admitted")
        done = e["execution_id"]

        def event():
            for headers, body in receiver.received():
                sent = json.loads(body)
                if sent["data"]["execution_id"] == done:
                    return headers, body, sent
            return None
        headers, body, sent = ui.until(event, "the receiver got the execution's end", 20)
        check(sent["type"] == "execution.completed" and sent["data"]["status"] == "completed"
              and sent["data"]["tenant_id"] == "hooked" and sent["data"]["flow_id"] == "demo.echo",
              f"the event: execution.completed of hooked's demo.echo ({sent['type']})")
        check(all(headers.get(n) for n in ("webhook-id", "webhook-timestamp", "webhook-signature"))
              and abs(int(headers["webhook-timestamp"]) - time.time()) < 300,
              f"it carries webhook-id, webhook-timestamp (now) and webhook-signature ({headers.get('webhook-id')})")
        check(verify_signature(secret, headers, body), "its signature verifies with the secret the page showed")
        check(not verify_signature("whsec_" + base64.b64encode(b"not the secret").decode(), headers, body),
              "and not with another secret")

        row = f'#webhook-deliveries tr.delivery[data-execution="{done}"][data-delivered="true"]'
        ui.until(lambda: any(d["execution_id"] == done and d["delivered"]
                             for d in api.call("GET", "/api/tenants/hooked/webhook/deliveries")[1]["deliveries"]),
                 "the API's delivery log has it")
        ui.click("#webhook-refresh")
        ui.sees(lambda: ui.present(row), "Refresh: the delivery listed, delivered")
        check(ui.text(f"{row} .type") == "execution.completed" and ui.text(f"{row} .result") == "delivered"
              and ui.text(f"{row} .http-status") == "204" and ui.text(f"{row} .attempt") == "1"
              and ui.attr(row, "data-webhook-id") == headers["webhook-id"],
              f"its row: execution.completed, delivered, HTTP 204, attempt 1, the event's webhook-id ({ui.text(row)})")
        check(ui.attr("#webhook-delivered", "data-count") == "1" and ui.attr("#webhook-pending", "data-count") == "0"
              and ui.text("#webhook-last-delivered") != "—", "the counts: 1 delivered, none pending, a last delivery")
        shot("webhook-delivered.png")
        ui.click(f"{row} a.exec-link")
        ui.sees(lambda: ui.text("#detail-status") == "completed" and f"#/t/hooked/executions/{done}" in ui.d.current_url,
                "the row's execution id opens its page")

        ui.go("#/t/hooked/webhook")
        ui.sees(lambda: ui.attr("#webhook-url-input", "value") == hook and ui.shown("#webhook-rotate"),
                "back on the webhook page: the address in the form, a secret to rotate")
        check(not ui.present("#webhook-secret"), "the secret is not shown again")
        ui.clear_toasts()
        ui.click("#webhook-submit")
        ui.sees(lambda: any("secret is unchanged" in t.text for t in ui.d.find_elements(By.CSS_SELECTOR, ".toast")),
                "saved again without rotating: the secret kept, none shown")
        check(not ui.present("#webhook-secret"), "no secret box for a kept secret")
        ui.click("#webhook-rotate")
        ui.click("#webhook-submit")
        rotated = ui.el("#webhook-secret", "the rotated secret").get_attribute("value")
        check(rotated.startswith("whsec_") and rotated != secret, "rotate secret: a new secret shown once")
        check(not ui.el("#webhook-rotate").is_selected(), "the rotate box is cleared after the save")

        ui.click("#webhook-remove")
        check("dropped" in ui.text("dialog.confirm"), "removing asks first, and says undelivered events are dropped")
        ui.confirm()
        ui.sees(lambda: ui.present("#no-webhook") and not ui.present("#webhook-remove") and not ui.present("#webhook-secret"),
                "removed: the page shows no webhook again")
        check(api.call("GET", "/api/tenants/hooked/webhook")[0] == 404, "the API has no webhook for hooked either")
    no_errors(ui, "webhook")
    within_deadline()

    # --- Role gating, each role in a fresh session.
    check(api.call("PUT", "/api/tenants/acme", {"max_queued": None})[0] == 200, "acme's queue limit back to the default")
    status, pending = api.call("POST", "/api/executions", {"flow_id": "demo.echo", "delay": "1h"}, tenant="acme")
    check(status == 201 and pending["queue_state"] == "scheduled", "a scheduled execution for the role checks")
    ui.login(tokens["worker"])
    ui.until(lambda: "pull API" in ui.text("#login-error"), "a worker key is told the console is not for it")
    check(not ui.present("#who-role"), "a worker key does not sign in")
    ui.login(tokens["viewer"])
    check(ui.text("#who-role") == "viewer", "the viewer key signs in as viewer")
    ui.el("#executions-table")
    ui.until(lambda: ui.row_status(first), "the viewer reads executions")
    check(not ui.present("#new-execution") and not ui.present("#bulk-cancel") and not ui.present(".row-select"),
          "viewer: no admission, no bulk actions")
    check(not ui.present("#nav-api-keys") and not ui.present("#nav-webhook") and not ui.present("#nav-tenants")
          and not ui.present("#nav-overview") and not ui.present("#nav-trends"),
          "viewer: no keys, webhook, tenants, overview or trends in the menu")
    ui.go(f"#/t/acme/executions/{first}")
    ui.el("#detail-status")
    check(not ui.present("#action-cancel") and not ui.present("#action-retry") and not ui.present("#action-force-delete"),
          "viewer: no actions on an execution")
    ui.go(f"#/t/acme/executions/{pending['execution_id']}")
    ui.until(lambda: ui.text("#detail-queue-state") == "scheduled", "viewer: a scheduled execution's detail")
    check(not ui.present("#reschedule-form") and ui.text("#detail-run-at .due-time") == shown_time(pending["run_at"]),
          "viewer: its due time, and no reschedule")
    ui.go("#/tenants")
    ui.el("#not-allowed", "viewer: the tenants page is not offered")
    ui.go("#/t/acme/webhook")
    ui.el("#not-allowed", "viewer: the webhook page is not offered")
    ui.go("#/t/acme/dead-letters")
    ui.el("#dead-letters-table")
    check(not ui.present("#dlq-replay") and not ui.present("#dlq-dismiss"), "viewer: no replay or dismiss")

    ui.login(tokens["editor"])
    check(ui.text("#who-role") == "editor", "the editor key signs in as editor")
    ui.el("#new-execution", "editor: New execution offered")
    check(ui.present("#bulk-cancel") and ui.present("#bulk-retry"), "editor: bulk cancel and retry offered")
    check(not ui.present("#nav-api-keys") and not ui.present("#nav-webhook") and not ui.present("#nav-tenants"),
          "editor: no keys, webhook or tenants")
    ed = ui.admitted_id("demo.sleep", '{"ms": 60000}')
    ui.go(f"#/t/acme/executions/{ed}")
    ui.el("#action-cancel", "editor: Cancel offered")
    check(not ui.present("#action-force-delete"), "editor: no Force delete")
    ui.click("#action-cancel")
    ui.until(lambda: ui.text("#detail-status") == "cancelled", "the editor cancelled it")
    ui.go(f"#/t/acme/executions/{pending['execution_id']}")
    ui.sees(lambda: ui.present("#reschedule-form"), "editor: Reschedule offered on a scheduled execution")
    ui.click("#action-cancel")
    ui.sees(lambda: ui.text("#detail-status") == "cancelled" and not ui.present("#reschedule-form"),
             "the editor cancelled the scheduled one: no reschedule after")
    ui.go("#/t/acme/dead-letters")
    ui.el("#dead-letters-table")
    check(ui.present("#dlq-replay") and ui.present("#dlq-dismiss"), "editor: replay and dismiss offered")

    ui.login(tokens["admin"])
    check(ui.text("#who-role") == "admin", "the admin key signs in as admin")
    ui.el("#nav-api-keys", "admin: API keys offered")
    ui.click("#nav-webhook")
    ui.el("#no-webhook", "admin: its tenant's webhook page (none set)")
    ui.click("#nav-trends")
    ui.el("#tenant-activity", "admin: the tenant's trends")
    check(not ui.present("#nav-tenants") and not ui.present("#nav-overview"), "admin: no tenants or overview")
    ui.go(f"#/t/acme/executions/{ed}")
    ui.el("#action-force-delete", "admin: Force delete offered")
    ui.go("#/t/other/executions")
    ui.el("#not-allowed", "a tenant key cannot open another tenant")
    no_errors(ui, "roles")

    # --- Revoking: the viewer key (its next sign-in refused), then the editor key under a
    # signed-in session (sent back to the login by the next refresh).
    ui.go("#/t/acme/api-keys")
    viewer_id = tokens["viewer"].split("_")[1]
    ui.click(f'#api-keys-body tr[data-key="{viewer_id}"] .revoke-key')
    ui.confirm()
    ui.gone(f'#api-keys-body tr[data-key="{viewer_id}"]', "the viewer key no longer listed")
    check(api.call("GET", "/api/me", token=tokens["viewer"])[0] == 401, "the revoked key gets 401")
    ui.login(tokens["viewer"])
    check("not accepted" in ui.text("#login-error"), "the revoked key cannot sign in")
    ui.login(tokens["editor"])
    ui.el("#executions-table")
    Select(ui.el("#refresh-select")).select_by_value("2")
    status, _ = api.call("DELETE", f"/api/tenants/acme/api-keys/{tokens['editor'].split('_')[1]}")
    check(status == 204, "the editor key revoked behind the session's back")
    ui.el("#login-form", "a 401 sends the session back to the login")
    check("refused" in ui.text("#login-error")
          and ui.d.execute_script("return sessionStorage.getItem('sluice.token')") is None,
          "the login says why, and the token is dropped")
    no_errors(ui, "revoke")

    # --- Themes and times.
    ui.login(ADMIN_TOKEN)
    ui.go(f"#/t/acme/executions/{first}")
    ui.el("#detail-status")
    Select(ui.el("#theme-select")).select_by_value("dark")
    check(ui.d.execute_script("return document.documentElement.dataset.theme") == "dark", "the dark theme")
    Select(ui.el("#time-select")).select_by_value("utc")
    ui.until(lambda: "UTC" in ui.text("#timeline"), "times in UTC")
    shot("execution-dark.png")
    Select(ui.el("#theme-select")).select_by_value("system")
    Select(ui.el("#time-select")).select_by_value("local")

    # --- Dev auth: no login at all.
    ui.d.execute_script("sessionStorage.clear()")
    ui.d.get(f"{dev_base}/console/")
    check(ui.text("#who-role") == "platform admin" and not ui.present("#login-form"), "dev auth: no login")
    check(not ui.present("#logout"), "dev auth: nothing to sign out of")
    no_errors(ui, "dev auth")
    within_deadline()
    print(f"  ({ui.allowed_network_errors} network lines of provoked 4xx answers ignored)")


if __name__ == "__main__":
    args = sys.argv[1:]
    shots = None
    if "--screenshots" in args:
        i = args.index("--screenshots")
        shots = args[i + 1]
        del args[i:i + 2]
        os.makedirs(shots, exist_ok=True)
    if len(args) != 2:
        raise SystemExit(__doc__)
    try:
        main(args[0], args[1], shots)
    except Failed as e:
        raise SystemExit(f"console test FAILED after {checks} checks: {e}")
    print(f"console test: {checks} passed, 0 failed in {time.monotonic() - started:.0f} s")
