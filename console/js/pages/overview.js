// The platform admin's overview: per shard the ready/pending entries, leases, delayed
// retries and dead letters with the scripts' counters and their rates (from two readings of
// GET /api/queues), and tenant saturation: running + dispatched against max_concurrent,
// waiting against max_queued (GET /api/tenants). Refreshed every 5 s while the tab is visible.

import { call } from '../api.js';
import { h, replace, num, fmtTime } from '../dom.js';

const EVERY_MS = 5000;
const RATE_COUNTERS = ['completed', 'failed', 'cancelled', 'reclaimed', 'dead_lettered'];

export async function render(ctx) {
  const { main } = ctx;
  let previous = null;
  let timer = null;
  let stopped = false;

  const shardsBody = h('tbody', { id: 'shards-body' });
  const totals = h('p', { id: 'shard-totals', class: 'muted' });
  const unavailable = h('p', { id: 'shards-unavailable', class: 'error', hidden: true });
  const tenantsBody = h('tbody', { id: 'saturation-body' });
  const stamp = h('span', { class: 'muted', id: 'overview-updated' });
  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Overview'), h('div', { class: 'spacer' }), stamp),
    h('section', { class: 'panel' }, h('h2', {}, 'Tenant saturation'),
      h('table', { class: 'grid', id: 'saturation-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Tenant'), h('th', {}, 'Enabled'), h('th', {}, 'Running / max_concurrent'),
          h('th', {}, 'Waiting / max_queued'))),
        tenantsBody)),
    h('section', { class: 'panel' }, h('h2', {}, 'Shards'), totals, unavailable,
      h('div', { class: 'table-wrap' }, h('table', { class: 'grid', id: 'shards-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Shard'), h('th', {}, 'Ready'), h('th', {}, 'Pending'), h('th', {}, 'Leases'),
          h('th', {}, 'Delayed'), h('th', {}, 'DLQ'), RATE_COUNTERS.map((c) => h('th', {}, c)), h('th', {}, 'Other counters'))),
        shardsBody))));

  function bar(value, max, id) {
    return h('span', { class: 'bar' },
      h('meter', { min: 0, max: Math.max(max, 1), value, high: Math.max(max, 1) * 0.8, optimum: 0, id }),
      ` ${num(value)} / ${num(max)}`);
  }

  async function load() {
    const now = Date.now();
    const [queues, tenants] = await Promise.all([
      call('GET', '/api/queues'),
      call('GET', '/api/tenants?limit=200'),
    ]);
    if (stopped) return;
    const shards = queues.data.shards;
    const byNumber = new Map(shards.map((s) => [s.shard, s]));
    const sum = (k) => shards.reduce((a, s) => a + s[k], 0);
    totals.textContent = `${shards.length} shards: ${num(sum('ready'))} ready, ${num(sum('pending'))} pending, ` +
      `${num(sum('leases'))} leases, ${num(sum('delayed'))} delayed, ${num(sum('dead_letters'))} dead letters`;
    unavailable.hidden = queues.data.unavailable.length === 0;
    unavailable.textContent = queues.data.unavailable.map((u) => `shard ${u.shard}: ${u.error}`).join('; ');
    replace(shardsBody, shards.map((s) => {
      const before = previous && previous.shards.get(s.shard);
      const secs = previous ? (now - previous.at) / 1000 : 0;
      const others = Object.entries(s.counters).filter(([k, v]) => !RATE_COUNTERS.includes(k) && v > 0);
      return h('tr', { dataset: { shard: String(s.shard) } },
        h('td', {}, String(s.shard)), h('td', {}, num(s.ready)), h('td', {}, num(s.pending)), h('td', {}, num(s.leases)),
        h('td', {}, num(s.delayed)), h('td', { class: 'dlq' }, num(s.dead_letters)),
        RATE_COUNTERS.map((c) => {
          const v = s.counters[c] ?? 0;
          const r = before && secs > 0 ? (v - (before.counters[c] ?? 0)) / secs : null;
          return h('td', { class: `counter-${c}` }, num(v), r !== null ? h('span', { class: 'muted' }, ` ${r.toFixed(1)}/s`) : null);
        }),
        h('td', { class: 'muted' }, others.map(([k, v]) => `${k} ${num(v)}`).join(', ')));
    }));
    previous = { at: now, shards: byNumber };
    replace(tenantsBody, tenants.data.tenants.length === 0
      ? h('tr', {}, h('td', { colspan: 4, class: 'empty' }, 'No registered tenants.'))
      : tenants.data.tenants.map((t) => h('tr', { dataset: { tenant: t.tenant_id } },
        h('td', {}, h('a', { href: `#/t/${encodeURIComponent(t.tenant_id)}/executions` }, t.tenant_id)),
        h('td', {}, t.enabled ? 'yes' : 'no'),
        h('td', { class: 'slots' }, bar(t.usage.running, t.max_concurrent)),
        h('td', { class: 'queue' }, bar(t.usage.waiting, t.max_queued)))));
    stamp.textContent = `updated ${fmtTime(new Date(now).toISOString())}`;
  }

  async function tick() {
    if (stopped) return;
    if (document.visibilityState === 'visible') {
      try { await load(); } catch (e) { if (e.status !== 401) stamp.textContent = `not updated: ${e.message}`; }
    }
    if (!stopped) timer = setTimeout(tick, EVERY_MS);
  }
  await tick();
  return () => { stopped = true; clearTimeout(timer); };
}
