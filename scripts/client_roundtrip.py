"""Drives a live sluice through a client generated from openapi/openapi.json.

Run by scripts/client_roundtrip.sh, which generates the `sluice_client` package first and puts
it on PYTHONPATH. Starts its own redis-server and `sluice serve` on free loopback ports, then:
create a tenant and an editor key (as the platform admin), and with that key admit -> replay ->
get -> list -> cancel -> retry (no body, then an empty one) -> reschedule a scheduled one (each
of the body's two shapes), plus one error answer parsed as a problem document.

Usage: python client_roundtrip.py <path to the sluice binary>
"""

import datetime
import os
import subprocess
import sys
import tempfile
import time

from harness import free_port, start_redis
from sluice_client import AuthenticatedClient, Client
from sluice_client.api.api_keys import create_api_key
from sluice_client.api.executions import (
    cancel_execution,
    create_execution,
    get_execution,
    list_executions,
    reschedule_execution,
    retry_execution,
)
from sluice_client.api.operations import readyz
from sluice_client.api.tenants import put_tenant
from sluice_client.models import (
    CreatedApiKey,
    Execution,
    ExecutionPage,
    KeyRole,
    NewApiKey,
    NewExecution,
    Problem,
    QueueState,
    RescheduleAfter,
    RescheduleAt,
    RetryBody,
    Status,
    Tenant,
    TenantSettings,
)
from sluice_client.models.new_execution_params_type_0 import NewExecutionParamsType0

ADMIN_TOKEN = "roundtrip-admin-token-" + os.urandom(8).hex()
checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise SystemExit(f"client round trip FAILED: {what}")
    checks += 1
    print(f"  ok  {what}")


def wait_ready(base_url, deadline_s=30):
    client = Client(base_url=base_url, timeout=2.0)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if readyz.sync_detailed(client=client).status_code == 200:
                return
        except Exception:  # not listening yet
            pass
        time.sleep(0.1)
    raise SystemExit("sluice did not become ready")


def main(sluice_bin):
    data = tempfile.mkdtemp(prefix="sluice-roundtrip-")
    api_port = free_port()
    procs = []
    try:
        redis, redis_url = start_redis(data)
        procs.append(redis)
        env = dict(os.environ, SLUICE_ADMIN_TOKEN=ADMIN_TOKEN)
        procs.append(
            subprocess.Popen(
                [sluice_bin, "serve", "--listen", f"127.0.0.1:{api_port}",
                 "--redis-url", redis_url],
                env=env,
                stdout=subprocess.DEVNULL,
            )
        )
        base_url = f"http://127.0.0.1:{api_port}"
        wait_ready(base_url)
        run(base_url)
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def run(base_url):
    admin = AuthenticatedClient(base_url=base_url, token=ADMIN_TOKEN, timeout=10.0)
    tenant = put_tenant.sync(
        tenant="acme", client=admin, body=TenantSettings(max_concurrent=10, max_queued=100)
    )
    check(isinstance(tenant, Tenant) and tenant.max_concurrent == 10, "put_tenant as admin")
    key = create_api_key.sync(
        tenant="acme", client=admin, body=NewApiKey(role=KeyRole.EDITOR, name="roundtrip")
    )
    check(isinstance(key, CreatedApiKey) and key.token.startswith("sk_"), "create_api_key")

    client = AuthenticatedClient(base_url=base_url, token=key.token, timeout=10.0)
    body = NewExecution(
        flow_id="demo.echo", params=NewExecutionParamsType0.from_dict({"order": 42})
    )
    first = create_execution.sync_detailed(client=client, body=body, idempotency_key="rt-42")
    check(first.status_code == 201 and isinstance(first.parsed, Execution), "admit: 201")
    execution = first.parsed
    check(execution.tenant_id == "acme" and execution.status == Status.QUEUED,
          "admit: queued for the key's tenant")
    again = create_execution.sync_detailed(client=client, body=body, idempotency_key="rt-42")
    check(again.status_code == 200 and again.parsed.deduplicated
          and again.parsed.execution_id == execution.execution_id, "admit again: replayed")

    got = get_execution.sync(id=execution.execution_id, client=client)
    check(isinstance(got, Execution) and got.params.to_dict() == {"order": 42}, "get")

    page = list_executions.sync(client=client, limit=10)
    check(isinstance(page, ExecutionPage)
          and [e.execution_id for e in page.executions] == [execution.execution_id]
          and page.total == 1, "list")

    cancelled = cancel_execution.sync(id=execution.execution_id, client=client)
    check(isinstance(cancelled, Execution) and cancelled.status == Status.CANCELLED, "cancel")

    # A retry takes no body, or an empty one.
    retried = retry_execution.sync(id=execution.execution_id, client=client)
    check(isinstance(retried, Execution) and retried.status == Status.QUEUED, "retry: no body")
    cancel_execution.sync(id=execution.execution_id, client=client)
    retried = retry_execution.sync(id=execution.execution_id, client=client, body=RetryBody())
    check(isinstance(retried, Execution) and retried.status == Status.QUEUED, "retry: {}")

    # A reschedule takes exactly one of its two shapes.
    later = create_execution.sync(
        client=client, body=NewExecution(flow_id="demo.echo", delay="1h")
    )
    moved = reschedule_execution.sync(
        id=later.execution_id, client=client, body=RescheduleAfter(delay="2h")
    )
    check(isinstance(moved, Execution) and moved.queue_state == QueueState.SCHEDULED
          and moved.run_at > later.run_at, "reschedule: after a delay")
    at = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=3)).replace(
        microsecond=0
    )
    moved = reschedule_execution.sync(
        id=later.execution_id, client=client, body=RescheduleAt(run_at=at)
    )
    check(isinstance(moved, Execution) and moved.run_at == at, "reschedule: at a time")

    missing = get_execution.sync(id="0" * 32, client=client)
    check(isinstance(missing, Problem) and missing.code == "execution_not_found",
          "unknown id: a parsed problem document")
    print(f"client round trip: {checks} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv[1])
