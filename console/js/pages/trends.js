// One tenant's activity over the last 24 hours (tenant admin or platform admin): starts,
// completions and failures per minute and waiting time p50/p99 as charts, from
// GET /api/tenants/{tenant}/trends, with the tenant's usage and storage now (GET
// /api/tenants/{tenant}, absent for a tenant never registered and without executions). "Is this tenant starved, and
// since when?" reads from the waiting-time chart. Refreshed every 10 s while visible.

import { call } from '../api.js';
import { h, replace, num, fmtTime } from '../dom.js';
import { trendCharts } from '../chart.js';
import { storageText } from './tenants.js';

const EVERY_MS = 10000;

export async function render(ctx) {
  const { main, tenant } = ctx;
  const enc = encodeURIComponent(tenant);
  let timer = null;
  let stopped = false;
  const charts = h('div', { class: 'charts', id: 'tenant-trends' });
  const usage = h('p', { id: 'tenant-usage', class: 'muted' });
  const storage = h('p', { id: 'tenant-storage', class: 'muted' });
  const stamp = h('span', { class: 'muted', id: 'trends-updated' });
  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, `Trends of ${tenant}`), h('div', { class: 'spacer' }), stamp),
    h('section', { class: 'panel' }, h('h2', {}, 'Last 24 hours'), usage, storage, charts));

  async function load() {
    const [trends, state] = await Promise.all([
      call('GET', `/api/tenants/${enc}/trends`),
      call('GET', `/api/tenants/${enc}`).catch((e) => { if (e.status === 404) return null; throw e; }),
    ]);
    if (stopped) return;
    replace(charts, trendCharts(trends.data.series, 'tenant'));
    const u = state && state.data.usage;
    const perKey = state && state.data.max_concurrent_per_key !== null
      ? `, max_concurrent_per_key ${num(state.data.max_concurrent_per_key)}` : '';
    const blocked = state ? state.data.concurrency_keys.blocked : 0;
    usage.textContent = u
      ? `Now: ${num(u.running)} running, ${num(u.waiting)} waiting, ${num(u.scheduled)} scheduled ` +
        `(max_concurrent ${num(state.data.max_concurrent)}, max_queued ${num(state.data.max_queued)}${perKey})` +
        (blocked ? `; ${num(blocked)} concurrency ${blocked === 1 ? 'key' : 'keys'} at the limit with work waiting.` : '.')
      : 'Now: no executions and no limits of its own.';
    storage.textContent = state ? `Storage: ${storageText(state.data)}.` : '';
    stamp.textContent = `updated ${fmtTime(new Date().toISOString())}`;
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
