// The platform admin's overview, read at a glance: every tenant's activity over the last 24
// hours as charts (starts, completions and failures per minute, waiting time p50/p99, from
// GET /api/trends), the tenants with work now (queued or running, registered or not), tenant
// saturation (running against max_concurrent, queued against max_queued, from
// GET /api/tenants), and the shards summed in one line with the per-shard table folded
// below it (GET /api/queues; rates from two readings). Refreshed every 5 s while the tab is
// visible.

import { call } from '../api.js';
import { h, replace, num, fmtTime } from '../dom.js';
import { trendCharts } from '../chart.js';

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
  const charts = h('div', { class: 'charts', id: 'overview-trends' });
  const trendsNote = h('p', { class: 'error', id: 'trends-unavailable', hidden: true });
  const workBody = h('tbody', { id: 'work-body' });
  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Overview'), h('div', { class: 'spacer' }), stamp),
    h('section', { class: 'panel' }, h('h2', {}, 'All tenants, last 24 hours'), trendsNote, charts),
    h('section', { class: 'panel' }, h('h2', {}, 'Tenants with work now'),
      h('table', { class: 'grid', id: 'work-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Tenant'), h('th', {}, 'Registered'), h('th', {}, 'Queued'), h('th', {}, 'Running'))),
        workBody)),
    h('section', { class: 'panel' }, h('h2', {}, 'Tenant saturation'),
      h('table', { class: 'grid', id: 'saturation-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Tenant'), h('th', {}, 'Enabled'), h('th', {}, 'Running / max_concurrent'),
          h('th', {}, 'Queued / max_queued'))),
        tenantsBody)),
    h('section', { class: 'panel' }, h('h2', {}, 'Shards'), totals, unavailable,
      h('details', { id: 'shard-details' }, h('summary', {}, 'Per shard'),
        h('div', { class: 'table-wrap' }, h('table', { class: 'grid', id: 'shards-table' },
          h('thead', {}, h('tr', {}, h('th', {}, 'Shard'), h('th', {}, 'Ready'), h('th', {}, 'Pending'), h('th', {}, 'Leases'),
            h('th', {}, 'Delayed'), h('th', {}, 'DLQ'), RATE_COUNTERS.map((c) => h('th', {}, c)), h('th', {}, 'Other counters'))),
          shardsBody)))));

  function bar(value, max, id) {
    return h('span', { class: 'bar' },
      h('meter', { min: 0, max: Math.max(max, 1), value, high: Math.max(max, 1) * 0.8, optimum: 0, id }),
      ` ${num(value)} / ${num(max)}`);
  }

  async function load() {
    const now = Date.now();
    const [queues, tenants, trends] = await Promise.all([
      call('GET', '/api/queues'),
      call('GET', '/api/tenants?limit=200'),
      call('GET', '/api/trends'),
    ]);
    if (stopped) return;
    const tr = trends.data;
    replace(charts, trendCharts(tr.series, 'overview'));
    trendsNote.hidden = tr.unavailable.length === 0;
    trendsNote.textContent = tr.unavailable.length === 0 ? ''
      : `Not counted (shard not answering): ${tr.unavailable.map((u) => `shard ${u.shard}`).join(', ')}`;
    replace(workBody, tr.tenants_with_work.length === 0
      ? h('tr', {}, h('td', { colspan: 4, class: 'empty', id: 'no-work' }, 'No tenant has queued or running executions.'))
      : tr.tenants_with_work.map((w) => h('tr', { dataset: { tenant: w.tenant_id } },
        h('td', {}, h('a', { href: `#/t/${encodeURIComponent(w.tenant_id)}/trends` }, w.tenant_id)),
        h('td', { class: 'registered' }, w.registered ? 'yes' : 'no'),
        h('td', { class: 'queued' }, num(w.queued)),
        h('td', { class: 'running' }, num(w.running)))));
    const shards = queues.data.shards;
    const byNumber = new Map(shards.map((s) => [s.shard, s]));
    const sum = (k) => shards.reduce((a, s) => a + s[k], 0);
    const withDlq = shards.filter((s) => s.dead_letters > 0).map((s) => s.shard);
    totals.textContent = `${shards.length} shards: ${num(sum('ready'))} ready, ${num(sum('pending'))} pending, ` +
      `${num(sum('leases'))} leases, ${num(sum('delayed'))} delayed, ${num(sum('dead_letters'))} dead letters` +
      (withDlq.length ? ` (in shard ${withDlq.join(', ')})` : '');
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
        h('td', { class: 'queue' }, bar(t.usage.waiting + t.usage.scheduled, t.max_queued)))));
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
