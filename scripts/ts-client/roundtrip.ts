// A TypeScript client of sluice made the way a new user makes one: types generated from
// openapi/openapi.json by openapi-typescript with its default options (`schema.d.ts`, made by
// scripts/ts_client.sh), calls through openapi-fetch. This file compiles under `tsc --strict`
// only if the document describes the API well enough for typed calls (parameters, bodies,
// answers, problem documents); run, it drives a live server through admit, replay, conflict,
// wait, the event stream, reschedule, cancel, retry and list, and checks each answer as a user
// would.
//
// Starts its own redis-server, `sluice serve` and `sluice worker --demo-flows` on free loopback
// ports. Usage: node roundtrip.js <path to the sluice binary>

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Execution = components["schemas"]["Execution"];
type Problem = components["schemas"]["Problem"];

const ADMIN_TOKEN = `ts-roundtrip-admin-${process.pid}-${Date.now()}`;
let checks = 0;

function check(condition: boolean, what: string): void {
  if (!condition) {
    throw new Error(`TypeScript client round trip FAILED: ${what}`);
  }
  checks += 1;
  console.log(`  ok  ${what}`);
}

/** A free loopback port (bound, read, released). */
async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** Whether something accepts connections on the port now. */
async function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = new Socket();
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
    socket.connect(port, "127.0.0.1");
  });
}

/** Polls `check` every 50 ms until it holds, at most `seconds`. */
async function until(what: string, seconds: number, ok: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    if (await ok()) {
      return;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what} did not happen within ${seconds} s`);
}

async function main(sluice: string): Promise<void> {
  const data = mkdtempSync(join(tmpdir(), "sluice-ts-roundtrip-"));
  const children: ChildProcess[] = [];
  try {
    const redisPort = await freePort();
    const apiPort = await freePort();
    const quiet = { stdio: ["ignore", "ignore", "inherit"] as ("ignore" | "inherit")[] };
    children.push(
      spawn(
        "redis-server",
        ["--port", `${redisPort}`, "--bind", "127.0.0.1", "--dir", data, "--save", "", "--appendonly", "no"],
        quiet,
      ),
    );
    await until("redis-server listening", 30, () => listening(redisPort));
    const redisUrl = `redis://127.0.0.1:${redisPort}`;
    const env = { ...process.env, SLUICE_ADMIN_TOKEN: ADMIN_TOKEN };
    children.push(
      spawn(sluice, ["serve", "--listen", `127.0.0.1:${apiPort}`, "--redis-url", redisUrl], { ...quiet, env }),
    );
    children.push(spawn(sluice, ["worker", "--demo-flows", "--redis-url", redisUrl], { ...quiet, env }));
    const baseUrl = `http://127.0.0.1:${apiPort}`;
    const anonymous = createClient<paths>({ baseUrl });
    await until("sluice ready", 60, async () => {
      try {
        return (await anonymous.GET("/readyz")).response.status === 200;
      } catch {
        return false;
      }
    });
    await run(baseUrl);
    console.log(`TypeScript client round trip: ${checks} passed, 0 failed`);
  } finally {
    for (const child of children.reverse()) {
      child.kill("SIGTERM");
    }
    rmSync(data, { recursive: true, force: true });
  }
}

async function run(baseUrl: string): Promise<void> {
  const admin = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
  const tenant = await admin.PUT("/api/tenants/{tenant}", {
    params: { path: { tenant: "acme" } },
    body: { max_concurrent: 10, max_queued: 100 },
  });
  check(tenant.data?.max_concurrent === 10, "put_tenant as the platform admin");
  const created = await admin.POST("/api/tenants/{tenant}/api-keys", {
    params: { path: { tenant: "acme" } },
    body: { role: "editor", name: "ts-roundtrip" },
  });
  const token = created.data?.token ?? "";
  check(created.response.status === 201 && token.startsWith("sk_"), "create_api_key: an editor key");

  const client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${token}` } });

  // Admit, with parameters (they must type-check as a free-form object).
  const body = { flow_id: "demo.echo", params: { order: 42, items: ["a", "b"] } };
  const first = await client.POST("/api/executions", {
    params: { header: { "Idempotency-Key": "ts-42" } },
    body,
  });
  // Both 2xx answers of an admission are an `Execution`: no narrowing needed.
  const admitted: Execution | undefined = first.data;
  check(first.response.status === 201 && admitted !== undefined, "admit: 201 with the execution");
  const id = admitted?.execution_id ?? "";
  check(admitted?.tenant_id === "acme" && /^[0-9a-f]{32}$/.test(id), "admit: the key's tenant, a 32-hex id");
  check(first.response.headers.get("location") === `/api/executions/${id}`, "admit: Location names it");

  // The same request again: a replay of the same execution.
  const again = await client.POST("/api/executions", {
    params: { header: { "Idempotency-Key": "ts-42" } },
    body,
  });
  const replayed: Execution | undefined = again.data;
  check(
    again.response.status === 200 &&
      again.response.headers.get("idempotent-replayed") === "true" &&
      replayed?.execution_id === id &&
      replayed.deduplicated === true,
    "admit again: 200, replayed, the same id",
  );

  // The dry run is its own operation with its own answer type: the same key and request are
  // a duplicate of the execution the key holds, and nothing is admitted.
  const dry = await client.POST("/api/executions/dry-run", {
    params: { header: { "Idempotency-Key": "ts-42" } },
    body,
  });
  const decision: components["schemas"]["DryRunAnswer"] | undefined = dry.data;
  check(
    dry.response.status === 200 && decision?.decision === "duplicate" && decision.execution_id === id,
    "dry run: a duplicate of the execution the key holds",
  );

  // The same key with other params: a conflict, as a typed problem document.
  const conflict = await client.POST("/api/executions", {
    params: { header: { "Idempotency-Key": "ts-42" } },
    body: { flow_id: "demo.echo", params: { order: 43 } },
  });
  const problem: Problem | undefined = conflict.error;
  check(
    conflict.response.status === 422 &&
      problem?.code === "idempotency_key_conflict" &&
      problem.execution_id === id,
    "conflict: 422 idempotency_key_conflict naming the holder",
  );

  // Wait for it to end (the demo worker runs it): its output is its params.
  const waited = await client.GET("/api/executions/{id}", {
    params: { path: { id }, query: { wait: "20s" } },
  });
  check(waited.data?.status === "completed", "wait: completed within the wait");
  check(isDeepStrictEqual(waited.data?.output, body.params), "wait: the output is the params");

  // The event stream of a new execution, read to its terminal event.
  const sleeper = await client.POST("/api/executions", {
    body: { flow_id: "demo.sleep", params: { ms: 200 } },
  });
  const sleeperId = sleeper.data?.execution_id ?? "";
  check(sleeper.response.status === 201 && sleeperId !== "", "admit demo.sleep");
  const stream = await client.GET("/api/executions/{id}/events", {
    params: { path: { id: sleeperId } },
    parseAs: "stream",
  });
  check(
    stream.response.status === 200 &&
      (stream.response.headers.get("content-type") ?? "").startsWith("text/event-stream"),
    "events: a text/event-stream",
  );
  const statuses = await readStatuses(stream.data, 30_000);
  check(statuses[statuses.length - 1] === "completed", `events: ends completed (saw ${statuses.join(" → ")})`);
  const rank = (s: string): number => ["queued", "running", "completed"].indexOf(s);
  check(
    statuses.every((s, i) => rank(s) >= 0 && (i === 0 || rank(s) > rank(statuses[i - 1] ?? ""))),
    "events: each change once, in lifecycle order",
  );

  // A scheduled execution, cancelled before it is due.
  const later = await client.POST("/api/executions", {
    body: { flow_id: "demo.echo", delay: "1h", priority: 2 },
  });
  const laterId = later.data?.execution_id ?? "";
  check(later.data?.queue_state === "scheduled", "admit with a delay: scheduled");
  // Moved while it waits: a reschedule names exactly one of run_at and delay.
  const path = { path: { id: laterId } };
  const moved = await client.POST("/api/executions/{id}/reschedule", { params: path, body: { delay: "2h" } });
  check(moved.data?.queue_state === "scheduled", "reschedule: after a delay");
  const at = new Date(Date.now() + 3 * 3600_000).toISOString();
  const movedAt = await client.POST("/api/executions/{id}/reschedule", { params: path, body: { run_at: at } });
  check(Date.parse(movedAt.data?.run_at ?? "") === Date.parse(at), "reschedule: at a time");
  const neither = await client.POST("/api/executions/{id}/reschedule", {
    params: path,
    // @ts-expect-error: the types, like the server, want run_at or delay
    body: {},
  });
  check(neither.response.status === 400 && neither.error?.code === "invalid_schedule", "reschedule: {} is refused, as the types say");
  const cancelled = await client.POST("/api/executions/{id}/cancel", { params: path });
  check(cancelled.data?.status === "cancelled", "cancel: cancelled");

  // The listing has all three, newest first.
  const page = await client.GET("/api/executions", { params: { query: { limit: 10 } } });
  const listed = page.data?.executions.map((e) => e.execution_id) ?? [];
  check(
    page.response.status === 200 && JSON.stringify(listed) === JSON.stringify([laterId, sleeperId, id]),
    "list: the three executions, newest first",
  );
  const filtered = await client.GET("/api/executions", {
    params: { query: { status: "cancelled", limit: 10 } },
  });
  check(
    JSON.stringify(filtered.data?.executions.map((e) => e.execution_id)) === JSON.stringify([laterId]),
    "list: filtered by status",
  );

  // Retried (no body): queued again, now, for the worker.
  const retried = await client.POST("/api/executions/{id}/retry", { params: path });
  check(retried.data?.status === "queued" && retried.data.attempt === 0, "retry: queued again");

  // An unknown id: a typed 404 problem.
  const missing = await client.GET("/api/executions/{id}", { params: { path: { id: "0".repeat(32) } } });
  check(missing.response.status === 404 && missing.error?.code === "execution_not_found", "unknown id: 404 problem");
}

/** The `status` of each `execution` event of an SSE body, until a terminal one (or the end). */
async function readStatuses(body: ReadableStream<Uint8Array> | null | undefined, ms: number): Promise<string[]> {
  if (!body) {
    return [];
  }
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const timer = setTimeout(() => void reader.cancel(), ms);
  const statuses: string[] = [];
  let buffered = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        return statuses;
      }
      buffered += decoder.decode(value, { stream: true });
      let end: number;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const block = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        const lines = block.split("\n");
        const event = lines.find((l) => l.startsWith("event:"))?.slice(6).trim();
        const data = lines
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart())
          .join("\n");
        if (event === "execution") {
          const execution = JSON.parse(data) as Execution;
          statuses.push(execution.status);
          if (["completed", "failed", "cancelled"].includes(execution.status)) {
            return statuses;
          }
        }
      }
    }
  } finally {
    clearTimeout(timer);
    void reader.cancel().catch(() => undefined);
  }
}

const sluice = process.argv[2];
if (!sluice) {
  console.error("usage: node roundtrip.js <path to the sluice binary>");
  process.exit(2);
}
main(sluice).then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error instanceof Error ? error.message : error);
    process.exit(1);
  },
);
