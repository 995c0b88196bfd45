// Dead letters, newest first: of one tenant (#/t/{tenant}/dead-letters), or of every tenant
// for the platform admin (#/dead-letters). Paged by the `before` cursor kept in the URL;
// replay (retry) of the selected records' executions, and dismissing (acknowledging) records.

import { call, query } from '../api.js';
import { h, replace, fmtTime, toast } from '../dom.js';
import { execLink } from './executions.js';

const PAGE = 50;

export async function render(ctx) {
  const { tenant, can, main } = ctx;
  const before = ctx.route.params.get('before') || '';
  const base = tenant ? `#/t/${encodeURIComponent(tenant)}/dead-letters` : '#/dead-letters';
  const selected = new Map();
  let records = [];
  const keyOf = (d) => `${d.shard}/${d.entry_id}`;

  const tbody = h('tbody', { id: 'dead-letters-body' });
  const pager = h('span', { class: 'pager' });
  // What the listing covers: records kept, the cap (a tenant's), and evictions by the caps.
  const kept = h('p', { class: 'muted', id: 'dead-letters-kept' });
  const replayBtn = can.retry ? h('button', { id: 'dlq-replay', type: 'button', disabled: true, onclick: replay }, 'Replay selected') : null;
  const dismissBtn = can.dismiss ? h('button', { id: 'dlq-dismiss', type: 'button', disabled: true, onclick: dismiss }, 'Dismiss selected') : null;
  const checkable = !!(replayBtn || dismissBtn);
  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Dead letters'), h('span', { class: 'muted' }, tenant ? ` tenant ${tenant}` : ' every tenant')),
    h('p', { class: 'muted' }, 'Executions that failed for good: attempts used up (handler_error, lease_lost) or a poison entry. A failure the handler marked not retryable ends failed without a record. Replay re-queues the execution with fresh attempts; dismiss removes the record once it is dealt with (the execution stays as it is).'),
    kept,
    h('div', { class: 'toolbar' }, pager, h('div', { class: 'spacer' }), replayBtn, dismissBtn),
    h('div', { class: 'table-wrap' }, h('table', { class: 'grid', id: 'dead-letters-table' },
      h('thead', {}, h('tr', {}, checkable ? h('th', { class: 'check' }) : null, h('th', {}, 'When'), tenant ? null : h('th', {}, 'Tenant'),
        h('th', {}, 'Execution'), h('th', {}, 'Flow'), h('th', {}, 'Reason'), h('th', {}, 'Attempts'), h('th', {}, 'Message'))),
      tbody)));

  function update() {
    const n = selected.size;
    if (replayBtn) { replayBtn.disabled = n === 0; replayBtn.textContent = `Replay selected (${n})`; }
    if (dismissBtn) { dismissBtn.disabled = n === 0; dismissBtn.textContent = `Dismiss selected (${n})`; }
  }

  function draw() {
    replace(tbody, records.length === 0
      ? h('tr', {}, h('td', { colspan: 8, class: 'empty', id: 'no-dead-letters' }, 'No dead letters.'))
      : records.map((d) => h('tr', { dataset: { execution: d.execution_id, entry: d.entry_id } },
        checkable ? h('td', { class: 'check' }, h('input', {
          type: 'checkbox', class: 'row-select', 'aria-label': `Select ${d.entry_id}`, checked: selected.has(keyOf(d)),
          onchange: (e) => { if (e.target.checked) selected.set(keyOf(d), d); else selected.delete(keyOf(d)); update(); },
        })) : null,
        h('td', { class: 'time' }, fmtTime(d.dead_lettered_at)),
        tenant ? null : h('td', {}, d.tenant_id ?? '—'),
        h('td', {}, d.tenant_id ? execLink(d.tenant_id, d.execution_id) : h('span', { class: 'mono' }, d.execution_id)),
        h('td', {}, d.flow_id ?? '—'),
        h('td', { class: 'reason' }, d.reason),
        h('td', {}, String(d.attempts)),
        h('td', { class: 'message' }, d.message))));
    update();
  }

  async function load() {
    const { data } = await call('GET', `/api/dlq${query({ limit: PAGE, before })}`, { tenant: tenant || undefined });
    records = data.dead_letters;
    replace(kept, data.cap == null
      ? `${data.total} records in all; ${data.evicted} evicted by the caps.`
      : `${data.total} of at most ${data.cap} records kept; ${data.evicted} evicted (its oldest, beyond its cap or as the shard's largest holder).`);
    replace(pager,
      before ? h('a', { href: base, class: 'button', id: 'page-first' }, 'Newest') : null,
      data.next_before ? h('a', { href: `${base}${query({ before: data.next_before })}`, class: 'button', id: 'page-next' }, 'Older') : null);
    draw();
  }

  async function replay() {
    let ok = 0;
    const refused = [];
    for (const d of selected.values()) {
      if (!d.tenant_id) { refused.push(`${d.entry_id}: poison (no execution)`); continue; }
      try {
        await call('POST', `/api/executions/${d.execution_id}/retry`, { tenant: d.tenant_id });
        ok++;
      } catch (e) {
        if (e.status === 401) return;
        refused.push(`${d.execution_id.slice(0, 8)}…: ${e.code}`);
      }
    }
    const n = selected.size;
    selected.clear();
    toast(`Replayed ${ok} of ${n}.${refused.length ? ` Refused: ${refused.join(', ')}` : ''}`, refused.length ? 'error' : 'info');
    await load();
  }

  async function dismiss() {
    let ok = 0;
    const refused = [];
    for (const d of selected.values()) {
      try {
        await call('DELETE', `/api/dlq/${d.shard}/${d.entry_id}`, { tenant: tenant || undefined });
        ok++;
      } catch (e) {
        if (e.status === 401) return;
        refused.push(`${d.entry_id}: ${e.code}`);
      }
    }
    const n = selected.size;
    selected.clear();
    toast(`Dismissed ${ok} of ${n}.${refused.length ? ` Refused: ${refused.join(', ')}` : ''}`, refused.length ? 'error' : 'info');
    await load();
  }

  try {
    await load();
  } catch (e) {
    if (e.status !== 401) replace(tbody, h('tr', {}, h('td', { colspan: 8, class: 'error' }, e.message)));
  }
  return null;
}
