// The BullMQ peer of sluice-bench's pickup phase: the same measurement, made with BullMQ.
//
// sluice-bench starts a redis-server of the peer's own (a free loopback port, no persistence)
// and runs `node peer.mjs --port P --rates '[{"rate":2,"secs":20}, ...]' --drain-secs 30`.
// For each rate, from an empty Redis (FLUSHALL): a `Worker` with BullMQ's DEFAULT settings
// (only the connection given; concurrency 1, drainDelay 5 s, ...) and a no-op processor runs
// in a child process of its own (so the producer's event loop never delays it, as sluice's
// worker is a process apart from the load generator); a `Queue` in this process adds jobs at
// the fixed rate, open loop (each job scheduled at start + k / rate; a late tick adds every job
// that is due); then it waits until every job completed (at most --drain-secs) and reads each
// job's `timestamp` (set by Queue.add, before the call goes out), `processedOn` (the worker's
// moveToActive) and `finishedOn` back from Redis. Pickup latency = processedOn − timestamp,
// admit→completed = finishedOn − timestamp, both in ms (the same machine's clock).
//
// It prints ONE JSON line on stdout (progress goes to stderr):
//   {"bullmq": "<version>", "node": "<version>", "rates": [{"rate", "secs", "scheduled",
//    "added", "add_errors", "completed", "unfinished", "unpicked", "pickup_ms": [...],
//    "done_ms": [...]}]}
// A job not picked up (or not finished) by the end of the drain is in `pickup_ms` (`done_ms`)
// with its age then: a lower bound, so a worker that falls behind cannot hide it. sluice-bench
// computes the percentiles (the same nearest-rank code as for sluice).
//
// `--noisy '{"flood": 12000, "ms": 20, "concurrency": 8, "calm_rate": 4, "calm_count": 100}'`
// runs the noisy-neighbour phase of sluice-bench's fairness group instead: one queue, one
// worker child with that concurrency whose processor sleeps `job.data.ms`; `flood` jobs of
// `ms` added at once (addBulk, 500 per call), then `calm_count` jobs of the same length added
// to the same queue at `calm_rate` per second, open loop, while the flood runs. It prints
//   {"bullmq", "node", "noisy": {"flood_added", "calm_added", "add_errors", "completed",
//    "unfinished", "unpicked", "calm_during_flood", "flood_span_ms", "flood_pickup_ms": [...],
//    "calm_pickup_ms": [...]}}
// with pickup = processedOn − timestamp as above; `calm_during_flood` counts the calm jobs
// added before the last flood job was picked up (the ones the flood could delay).
//
// `--role http --port P [--http-workers N]` is the HTTP admission peer of sluice-bench's
// admission phase: N processes (node:cluster, default: one per CPU, as sluice serve uses every
// core) share one loopback port and answer `POST /api/executions` as sluice does, with
// BullMQ doing the work: the job goes to a queue per tenant (`X-Tenant-Id`), its id is the
// tenant's `Idempotency-Key` (BullMQ's jobId dedup; no quota, no indexes: it does less than
// sluice), and the answer is 201 with `{"execution_id"}` (500 when Redis fails). The primary
// prints `{"listening": <port>, "bullmq", "node"}` once every process listens, and lives until
// it is killed (its processes exit when it goes).
//
// `--role fill --port P --queues A,B,... --count N --tag T --data-bytes B` is the cost
// benchmark's filler (sluice-bench --cost, bytes per queued job): `Queue.add(name, data,
// { jobId })` of N jobs, job k into queue k mod Q with jobId `T-k` and data
// `{"n": k, "p": "xx..."}` padded to B bytes of JSON (as sluice-bench pads sluice's params),
// 256 adds in flight; BullMQ's defaults otherwise (`removeOnComplete` is false by default, so
// a completed job is kept, as sluice keeps its row). It prints
//   {"bullmq", "node", "added", "errors"}
// and exits, so none of its connections is left on Redis when sluice-bench reads its memory.
//
// `--role drain --port P --queues A,B,... --concurrency C --expect N --timeout-secs S` runs a
// `Worker` per queue (concurrency C each, a no-op processor, BullMQ's defaults otherwise)
// until N jobs completed in all (counted from the workers' `completed` events: no Redis call
// of its own) or S seconds passed, closes them and prints
//   {"bullmq", "node", "completed", "failed", "ms"}
// Before it starts it prints `{"ready": true}` once every worker is connected, so the caller
// can start admitting while it runs (the end-to-end shape) or after (a backlog).
// sluice-bench's end-to-end peer phase runs it with `--expect` out of reach beside
// `--role http` (concurrency: a `sluice worker`'s spread over the queues), counts the completed
// jobs in Redis itself and kills it once all are there.
//
// `--role worker --port P --queue Q [--concurrency N]` is the child: it runs the Worker until
// its parent kills it, and says `{"ready": true}` over the IPC channel once the worker is
// connected.

import { fork } from 'node:child_process';
import cluster from 'node:cluster';
import { createServer } from 'node:http';
import { availableParallelism } from 'node:os';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';

import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

const { values: opts } = parseArgs({
  options: {
    role: { type: 'string', default: 'producer' },
    port: { type: 'string' },
    queue: { type: 'string' },
    rates: { type: 'string', default: '[]' },
    noisy: { type: 'string' },
    concurrency: { type: 'string' },
    'drain-secs': { type: 'string', default: '30' },
    'settle-ms': { type: 'string', default: '1000' },
    'http-workers': { type: 'string' },
    queues: { type: 'string' },
    count: { type: 'string' },
    tag: { type: 'string', default: 'job' },
    'data-bytes': { type: 'string', default: '30' },
    expect: { type: 'string' },
    'timeout-secs': { type: 'string', default: '600' },
  },
});

const port = Number(opts.port);
if (!Number.isInteger(port) || port <= 0) {
  throw new Error('--port is required');
}
// Loopback only, like every other process of the benchmark.
const connection = { host: '127.0.0.1', port };

function bullmqVersion() {
  const url = new URL('./node_modules/bullmq/package.json', import.meta.url);
  return JSON.parse(readFileSync(url, 'utf8')).version;
}

async function runWorker() {
  // BullMQ's defaults: nothing but the connection is set (and the concurrency, when the
  // noisy-neighbour phase asks for sluice's). A job with `data.ms` sleeps that long (the
  // flood's and the calm tenant's 20 ms jobs); the pickup phase's jobs return at once.
  const options = { connection };
  if (opts.concurrency !== undefined) options.concurrency = Number(opts.concurrency);
  const worker = new Worker(
    opts.queue,
    async (job) => {
      const ms = Number(job.data?.ms ?? 0);
      if (ms > 0) await sleep(ms);
    },
    options,
  );
  worker.on('error', (e) => process.stderr.write(`[bullmq worker] ${e}\n`));
  await worker.waitUntilReady();
  process.send({ ready: true });
  // Until the parent kills it (or goes away: then the IPC channel closes).
  process.on('disconnect', () => process.exit(0));
}

/** Starts the worker child for `queue`; resolves once it is connected. */
async function startWorker(queue, concurrency) {
  const self = new URL(import.meta.url).pathname;
  const args = ['--role', 'worker', '--port', String(port), '--queue', queue];
  if (concurrency !== undefined) args.push('--concurrency', String(concurrency));
  const child = fork(self, args, {
    stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
  });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the BullMQ worker did not start in 15 s')), 15_000);
    child.once('message', () => {
      clearTimeout(timer);
      resolve();
    });
    child.once('exit', (code) => reject(new Error(`the BullMQ worker exited (${code})`)));
  });
  return child;
}

async function stopWorker(child) {
  if (child.exitCode !== null) return;
  const gone = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await gone;
}

/** Adds jobs to `queue` at `rate` per second for `secs`, open loop; the ids and errors. Job
 * `k` is named `name` with data `data(k)`. */
async function produce(queue, rate, secs, name = 'echo', data = (k) => ({ n: k })) {
  const total = Math.max(1, Math.floor(rate * secs));
  const start = Date.now() + 10;
  const adds = [];
  let errors = 0;
  let k = 0;
  // Bounded: the schedule ends at start + secs; a late tick adds every job already due.
  while (k < total) {
    const now = Date.now();
    while (k < total && start + (k * 1000) / rate <= now) {
      adds.push(
        queue.add(name, data(k)).then(
          (job) => job.id,
          () => {
            errors += 1;
            return null;
          },
        ),
      );
      k += 1;
    }
    if (k < total) {
      const wait = Math.max(0, start + (k * 1000) / rate - Date.now());
      await sleep(Math.min(wait, 50));
    }
  }
  const ids = (await Promise.all(adds)).filter((id) => id !== null);
  return { scheduled: total, ids, errors };
}

/** Reads `timestamp`, `processedOn`, `finishedOn` of every job, 1000 per pipeline. */
async function readJobs(redis, queue, ids) {
  const out = [];
  for (let i = 0; i < ids.length; i += 1000) {
    const p = redis.pipeline();
    for (const id of ids.slice(i, i + 1000)) {
      p.hmget(queue.toKey(id), 'timestamp', 'processedOn', 'finishedOn');
    }
    for (const [err, row] of await p.exec()) {
      if (err) throw err;
      out.push(row.map((v) => (v === null ? null : Number(v))));
    }
  }
  return out;
}

async function runRate(redis, index, rate, secs, drainSecs, settleMs) {
  await redis.flushall();
  const name = `bench-${index}`;
  const child = await startWorker(name);
  const queue = new Queue(name, { connection });
  try {
    await queue.waitUntilReady();
    await sleep(settleMs);
    process.stderr.write(`[bullmq] ${rate}/s for ${secs} s\n`);
    const { scheduled, ids, errors } = await produce(queue, rate, secs);
    const deadline = Date.now() + drainSecs * 1000;
    let completed = 0;
    while (Date.now() < deadline) {
      completed = (await queue.getJobCounts('completed')).completed;
      if (completed >= ids.length) break;
      await sleep(20);
    }
    const end = Date.now();
    const rows = await readJobs(redis, queue, ids);
    const pickup = [];
    const done = [];
    let unfinished = 0;
    let unpicked = 0;
    for (const [timestamp, processedOn, finishedOn] of rows) {
      if (timestamp === null) continue;
      pickup.push(Math.max(0, (processedOn ?? end) - timestamp));
      done.push(Math.max(0, (finishedOn ?? end) - timestamp));
      if (finishedOn === null) unfinished += 1;
      if (processedOn === null) unpicked += 1;
    }
    return {
      rate,
      secs,
      scheduled,
      added: ids.length,
      add_errors: errors,
      completed,
      unfinished,
      unpicked,
      pickup_ms: pickup,
      done_ms: done,
    };
  } finally {
    await stopWorker(child);
    await queue.close();
  }
}

/** The noisy-neighbour phase (see the header). */
async function runNoisy(redis, plan, drainSecs, settleMs) {
  await redis.flushall();
  const name = 'noisy';
  const child = await startWorker(name, plan.concurrency);
  const queue = new Queue(name, { connection });
  try {
    await queue.waitUntilReady();
    await sleep(settleMs);
    process.stderr.write(`[bullmq noisy] flood of ${plan.flood} jobs of ${plan.ms} ms\n`);
    const floodIds = [];
    let errors = 0;
    for (let i = 0; i < plan.flood; i += 500) {
      const jobs = [];
      for (let k = i; k < Math.min(plan.flood, i + 500); k += 1) {
        jobs.push({ name: 'flood', data: { ms: plan.ms, n: k } });
      }
      try {
        for (const job of await queue.addBulk(jobs)) floodIds.push(job.id);
      } catch {
        errors += jobs.length;
      }
    }
    process.stderr.write(
      `[bullmq noisy] calm: ${plan.calm_count} jobs at ${plan.calm_rate}/s in the same queue\n`,
    );
    const calm = await produce(queue, plan.calm_rate, plan.calm_count / plan.calm_rate, 'calm', (k) => ({
      ms: plan.ms,
      n: k,
    }));
    errors += calm.errors;
    const total = floodIds.length + calm.ids.length;
    const deadline = Date.now() + drainSecs * 1000;
    let completed = 0;
    while (Date.now() < deadline) {
      completed = (await queue.getJobCounts('completed')).completed;
      if (completed >= total) break;
      await sleep(50);
    }
    const end = Date.now();
    const pickups = (rows) => {
      const out = [];
      let unpicked = 0;
      let unfinished = 0;
      for (const [timestamp, processedOn, finishedOn] of rows) {
        if (timestamp === null) continue;
        out.push(Math.max(0, (processedOn ?? end) - timestamp));
        if (processedOn === null) unpicked += 1;
        if (finishedOn === null) unfinished += 1;
      }
      return { out, unpicked, unfinished };
    };
    const floodRows = await readJobs(redis, queue, floodIds);
    const calmRows = await readJobs(redis, queue, calm.ids);
    const flood = pickups(floodRows);
    const calmP = pickups(calmRows);
    const floodStarts = floodRows.map((r) => r[1]).filter((v) => v !== null);
    const lastFloodStart = floodStarts.length ? Math.max(...floodStarts) : 0;
    const firstFloodStart = floodStarts.length ? Math.min(...floodStarts) : 0;
    const calmDuring = calmRows.filter((r) => r[0] !== null && r[0] <= lastFloodStart).length;
    return {
      flood_added: floodIds.length,
      calm_added: calm.ids.length,
      add_errors: errors,
      completed,
      unfinished: flood.unfinished + calmP.unfinished,
      unpicked: flood.unpicked + calmP.unpicked,
      calm_during_flood: calmDuring,
      flood_span_ms: lastFloodStart - firstFloodStart,
      flood_pickup_ms: flood.out,
      calm_pickup_ms: calmP.out,
    };
  } finally {
    await stopWorker(child);
    await queue.close();
  }
}

async function main() {
  if (opts.noisy !== undefined) {
    const redis = new IORedis({ ...connection, maxRetriesPerRequest: 3 });
    let noisy;
    try {
      noisy = await runNoisy(
        redis,
        JSON.parse(opts.noisy),
        Number(opts['drain-secs']),
        Number(opts['settle-ms']),
      );
    } finally {
      redis.disconnect();
    }
    const line = `${JSON.stringify({ bullmq: bullmqVersion(), node: process.version, noisy })}\n`;
    await new Promise((resolve) => process.stdout.write(line, resolve));
    return;
  }
  const rates = JSON.parse(opts.rates);
  const drainSecs = Number(opts['drain-secs']);
  const settleMs = Number(opts['settle-ms']);
  const redis = new IORedis({ ...connection, maxRetriesPerRequest: 3 });
  const results = [];
  try {
    for (const [i, { rate, secs }] of rates.entries()) {
      results.push(await runRate(redis, i, rate, secs, drainSecs, settleMs));
    }
  } finally {
    redis.disconnect();
  }
  const line = `${JSON.stringify({ bullmq: bullmqVersion(), node: process.version, rates: results })}\n`;
  // Writes to a pipe are asynchronous in Node: exit only once the line is out, or it is cut.
  await new Promise((resolve) => process.stdout.write(line, resolve));
}

/** The HTTP admission peer (see the header). */
async function runHttp() {
  if (cluster.isPrimary) {
    const n = Number(opts['http-workers'] ?? availableParallelism());
    const server = createServer();
    // Pick a free port once, then let every process listen on it.
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    const listenPort = server.address().port;
    await new Promise((resolve) => server.close(resolve));
    let ready = 0;
    for (let i = 0; i < n; i += 1) {
      const w = cluster.fork({ PEER_LISTEN_PORT: String(listenPort) });
      w.on('message', () => {
        ready += 1;
        if (ready === n) {
          const line = { listening: listenPort, bullmq: bullmqVersion(), node: process.version };
          process.stdout.write(`${JSON.stringify(line)}\n`);
        }
      });
      w.on('exit', (code) => {
        process.stderr.write(`[bullmq http] a process exited (${code})\n`);
        process.exit(1);
      });
    }
    return;
  }
  const queues = new Map();
  const queueOf = (tenant) => {
    let q = queues.get(tenant);
    if (!q) {
      q = new Queue(`t-${tenant}`, { connection });
      queues.set(tenant, q);
    }
    return q;
  };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const answer = (status, body) => {
        const text = JSON.stringify(body);
        res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
        res.end(text);
      };
      if (req.method !== 'POST' || req.url !== '/api/executions') {
        answer(404, { code: 'not_found' });
        return;
      }
      try {
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        const tenant = String(req.headers['x-tenant-id'] ?? 'default');
        const key = req.headers['idempotency-key'];
        const opts = key === undefined ? {} : { jobId: String(key) };
        const job = await queueOf(tenant).add(String(body.flow_id), body.params ?? {}, opts);
        answer(201, { execution_id: job.id });
      } catch (e) {
        answer(500, { code: 'internal', detail: String(e) });
      }
    });
  });
  server.keepAliveTimeout = 60_000;
  server.listen(Number(process.env.PEER_LISTEN_PORT), '127.0.0.1', () => process.send({ ready: true }));
  process.on('disconnect', () => process.exit(0));
}

/** `{"n": k, "p": "xx..."}` padded to `bytes` of JSON (no shorter than with an empty `p`):
 * the same data sluice-bench gives sluice's executions as params. */
function paddedData(k, bytes) {
  const bare = JSON.stringify({ n: k, p: '' }).length;
  return { n: k, p: 'x'.repeat(Math.max(0, bytes - bare)) };
}

function queueNames() {
  const names = String(opts.queues ?? '').split(',').filter((q) => q.length > 0);
  if (names.length === 0) throw new Error('--queues is required');
  return names;
}

/** The cost benchmark's filler (see the header). */
async function runFill() {
  const names = queueNames();
  const count = Number(opts.count ?? 0);
  const bytes = Number(opts['data-bytes']);
  const queues = names.map((name) => new Queue(name, { connection }));
  await Promise.all(queues.map((q) => q.waitUntilReady()));
  let next = 0;
  let added = 0;
  let errors = 0;
  // 256 adds in flight, each lane taking the next job when its last one answered. Bounded:
  // every lane ends when `count` jobs were taken.
  const lane = async () => {
    for (let k = next++; k < count; k = next++) {
      try {
        await queues[k % queues.length].add('echo', paddedData(k, bytes), { jobId: `${opts.tag}-${k}` });
        added += 1;
      } catch {
        errors += 1;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(256, Math.max(1, count)) }, lane));
  await Promise.all(queues.map((q) => q.close()));
  const line = { bullmq: bullmqVersion(), node: process.version, added, errors };
  await new Promise((resolve) => process.stdout.write(`${JSON.stringify(line)}\n`, resolve));
}

/** The cost benchmark's drain (see the header). */
async function runDrain() {
  const names = queueNames();
  const expect = Number(opts.expect ?? 0);
  const concurrency = Number(opts.concurrency ?? 256);
  const started = Date.now();
  let completed = 0;
  let failed = 0;
  let done;
  const finished = new Promise((resolve) => {
    done = resolve;
  });
  const workers = names.map((name) => {
    const w = new Worker(name, async () => {}, { connection, concurrency });
    w.on('completed', () => {
      completed += 1;
      if (completed + failed >= expect) done();
    });
    w.on('failed', () => {
      failed += 1;
      if (completed + failed >= expect) done();
    });
    w.on('error', (e) => process.stderr.write(`[bullmq drain] ${e}\n`));
    return w;
  });
  await Promise.all(workers.map((w) => w.waitUntilReady()));
  process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
  if (expect <= 0) done();
  const timer = setTimeout(done, Number(opts['timeout-secs']) * 1000);
  await finished;
  clearTimeout(timer);
  const ms = Date.now() - started;
  await Promise.all(workers.map((w) => w.close()));
  const line = { bullmq: bullmqVersion(), node: process.version, completed, failed, ms };
  await new Promise((resolve) => process.stdout.write(`${JSON.stringify(line)}\n`, resolve));
}

if (opts.role === 'fill') {
  await runFill();
  process.exit(0);
} else if (opts.role === 'drain') {
  await runDrain();
  process.exit(0);
} else if (opts.role === 'worker') {
  await runWorker();
} else if (opts.role === 'http') {
  await runHttp();
} else {
  await main();
  // Open handles (ioredis reconnect timers) must not keep the process alive; the result line
  // has been written by now.
  process.exit(0);
}
