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
// `--role worker --port P --queue Q` is the child: it runs the Worker until its parent kills
// it, and says `{"ready": true}` over the IPC channel once the worker is connected.

import { fork } from 'node:child_process';
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
    'drain-secs': { type: 'string', default: '30' },
    'settle-ms': { type: 'string', default: '1000' },
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
  // BullMQ's defaults: nothing but the connection is set.
  const worker = new Worker(opts.queue, async () => {}, { connection });
  worker.on('error', (e) => process.stderr.write(`[bullmq worker] ${e}\n`));
  await worker.waitUntilReady();
  process.send({ ready: true });
  // Until the parent kills it (or goes away: then the IPC channel closes).
  process.on('disconnect', () => process.exit(0));
}

/** Starts the worker child for `queue`; resolves once it is connected. */
async function startWorker(queue) {
  const self = new URL(import.meta.url).pathname;
  const child = fork(self, ['--role', 'worker', '--port', String(port), '--queue', queue], {
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

/** Adds jobs to `queue` at `rate` per second for `secs`, open loop; the ids and errors. */
async function produce(queue, rate, secs) {
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
        queue.add('echo', { n: k }).then(
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

async function main() {
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

if (opts.role === 'worker') {
  await runWorker();
} else {
  await main();
  // Open handles (ioredis reconnect timers) must not keep the process alive; the result line
  // has been written by now.
  process.exit(0);
}
