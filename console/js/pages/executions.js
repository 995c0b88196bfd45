// Executions of one tenant: filters kept in the URL (status, flow, dedup key, time range,
// cursor), `total`, cursor paging, auto-refresh at a chosen interval (paused while the tab is
// hidden), bulk cancel/retry of the selected rows, and the New execution form with every
// answer an admission can get (201, 200 replay, 422 conflict, 429 with Retry-After).

import { call, query, ApiError, isTerminal } from '../api.js';
import { h, replace, fmtTime, toInputTime, fromInputTime, statusBadge, toast, field, num } from '../dom.js';

const STATUSES = ['queued', 'running', 'completed', 'failed', 'cancelled'];
const PAGE = 50;
const INTERVALS = [['0', 'off'], ['2', '2 s'], ['5', '5 s'], ['10', '10 s'], ['30', '30 s']];

function refreshSetting() {
  const v = localStorage.getItem('sluice.refresh');
  return INTERVALS.some(([k]) => k === v) ? v : '5';
}

export function execLink(tenant, id, text) {
  return h('a', { href: `#/t/${encodeURIComponent(tenant)}/executions/${id}`, class: 'mono exec-link', dataset: { id } }, text || id);
}

export async function render(ctx) {
  const { tenant, can, main } = ctx;
  const p = ctx.route.params;
  const filters = {
    status: p.get('status') || '',
    flow_id: p.get('flow') || '',
    dedup_key: p.get('dedup') || '',
    created_from: p.get('from') || '',
    created_before: p.get('before') || '',
  };
  const cursor = p.get('cursor') || '';
  const base = `#/t/${encodeURIComponent(tenant)}/executions`;
  const hashFor = (f, c) => base + query({
    status: f.status, flow: f.flow_id, dedup: f.dedup_key, from: f.created_from, before: f.created_before, cursor: c,
  });

  const selected = new Set();
  let rows = [];
  let timer = null;
  let stopped = false;
  let loading = false;

  // Filters.
  const statusSel = h('select', { id: 'filter-status', name: 'status' },
    h('option', { value: '' }, 'any status'),
    STATUSES.map((s) => h('option', { value: s, selected: filters.status === s }, s)));
  const flowIn = h('input', { id: 'filter-flow', name: 'flow', value: filters.flow_id, placeholder: 'flow id', spellcheck: 'false' });
  const dedupIn = h('input', { id: 'filter-dedup', name: 'dedup', value: filters.dedup_key, placeholder: 'dedup key', spellcheck: 'false' });
  const fromIn = h('input', { id: 'filter-from', type: 'datetime-local', step: 1, value: toInputTime(filters.created_from) });
  const beforeIn = h('input', { id: 'filter-before', type: 'datetime-local', step: 1, value: toInputTime(filters.created_before) });
  const filterForm = h('form', {
    id: 'filters', class: 'filters',
    onsubmit: (e) => {
      e.preventDefault();
      location.hash = hashFor({
        status: statusSel.value, flow_id: flowIn.value.trim(), dedup_key: dedupIn.value,
        created_from: fromInput(fromIn), created_before: fromInput(beforeIn),
      }, '');
    },
  },
  field('Status', statusSel), field('Flow', flowIn), field('Dedup key', dedupIn),
  field('Created from', fromIn), field('Created before', beforeIn),
  h('div', { class: 'filter-buttons' },
    h('button', { type: 'submit', class: 'primary', id: 'filter-apply' }, 'Apply'),
    h('a', { href: base, class: 'button', id: 'filter-reset' }, 'Reset')));

  // Toolbar: total, paging, refresh, bulk actions.
  const totalEl = h('span', { id: 'total', class: 'total' }, '…');
  const refreshSel = h('select', {
    id: 'refresh-select', 'aria-label': 'Auto-refresh',
    onchange: () => { localStorage.setItem('sluice.refresh', refreshSel.value); schedule(); },
  }, INTERVALS.map(([v, l]) => h('option', { value: v, selected: refreshSetting() === v }, `refresh: ${l}`)));
  const refreshState = h('span', { id: 'refresh-state', class: 'muted' });
  const cancelBtn = can.cancel ? h('button', { id: 'bulk-cancel', type: 'button', disabled: true, onclick: () => bulk('cancel') }, 'Cancel selected') : null;
  const retryBtn = can.retry ? h('button', { id: 'bulk-retry', type: 'button', disabled: true, onclick: () => bulk('retry') }, 'Retry selected') : null;
  const newBtn = can.admit ? h('button', { id: 'new-execution', type: 'button', class: 'primary', onclick: () => { admitPanel.hidden = !admitPanel.hidden; if (!admitPanel.hidden) flowField.focus(); } }, 'New execution') : null;
  const pager = h('span', { class: 'pager' });

  const selectAll = h('input', {
    type: 'checkbox', id: 'select-all', 'aria-label': 'Select all',
    onchange: () => {
      for (const e of rows) { if (selectAll.checked) selected.add(e.execution_id); else selected.delete(e.execution_id); }
      drawRows();
    },
  });
  const tbody = h('tbody', { id: 'executions-body' });
  const table = h('table', { class: 'grid', id: 'executions-table' },
    h('thead', {}, h('tr', {},
      (can.cancel || can.retry) ? h('th', { class: 'check' }, selectAll) : null,
      h('th', {}, 'Execution'), h('th', {}, 'Flow'), h('th', {}, 'Status'), h('th', {}, 'Attempt'),
      h('th', {}, 'Dedup key'), h('th', {}, 'Created'))),
    tbody);

  // New execution.
  const flowField = h('input', { id: 'admit-flow', name: 'flow_id', required: true, placeholder: 'demo.echo', spellcheck: 'false' });
  const versionField = h('input', { id: 'admit-version', name: 'version', placeholder: 'optional', spellcheck: 'false' });
  const paramsField = h('textarea', { id: 'admit-params', name: 'params', rows: 5, spellcheck: 'false' });
  paramsField.value = '{}';
  const dedupField = h('input', { id: 'admit-dedup', name: 'dedup_key', placeholder: 'optional', spellcheck: 'false' });
  const admitResult = h('div', { id: 'admit-result', role: 'status', 'aria-live': 'polite' });
  const admitPanel = h('section', { class: 'panel', id: 'admit-panel', hidden: true },
    h('h2', {}, 'New execution'),
    h('form', {
      id: 'admit-form', class: 'admit',
      onsubmit: (e) => { e.preventDefault(); admit(); },
    },
    field('Flow', flowField), field('Version', versionField),
    field('Params (JSON object)', paramsField), field('Dedup key', dedupField, 'the same key with the same request returns the same execution'),
    h('div', { class: 'row-actions' }, h('button', { type: 'submit', class: 'primary', id: 'admit-submit' }, 'Admit'))),
    admitResult);

  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Executions'), h('span', { class: 'muted' }, ` tenant ${tenant}`), h('div', { class: 'spacer' }), newBtn),
    admitPanel,
    h('section', { class: 'panel' }, filterForm),
    h('div', { class: 'toolbar' }, totalEl, pager, h('div', { class: 'spacer' }), cancelBtn, retryBtn, refreshSel, refreshState),
    h('div', { class: 'table-wrap' }, table));

  function fromInput(input) { return fromInputTime(input.value); }

  function drawRows() {
    const checkable = can.cancel || can.retry;
    replace(tbody, rows.length === 0
      ? h('tr', {}, h('td', { colspan: 7, class: 'empty', id: 'no-executions' }, 'No executions match.'))
      : rows.map((e) => h('tr', { dataset: { id: e.execution_id, status: e.status } },
        checkable ? h('td', { class: 'check' }, h('input', {
          type: 'checkbox', class: 'row-select', 'aria-label': `Select ${e.execution_id}`, checked: selected.has(e.execution_id),
          onchange: (ev) => { if (ev.target.checked) selected.add(e.execution_id); else selected.delete(e.execution_id); updateBulk(); },
        })) : null,
        h('td', {}, execLink(tenant, e.execution_id)),
        h('td', { class: 'flow' }, e.flow_id, e.version ? h('span', { class: 'muted' }, ` @${e.version}`) : null),
        h('td', { class: 'status' }, statusBadge(e.status, e.queue_state || (e.cancel_requested && !isTerminal(e.status) ? 'cancel requested' : null))),
        h('td', {}, `${e.attempt}/${e.max_attempts}`),
        h('td', { class: 'dedup' }, e.dedup_key ?? ''),
        h('td', { class: 'time' }, fmtTime(e.created_at)))));
    updateBulk();
  }

  function updateBulk() {
    const n = selected.size;
    if (cancelBtn) { cancelBtn.disabled = n === 0; cancelBtn.textContent = `Cancel selected (${n})`; }
    if (retryBtn) { retryBtn.disabled = n === 0; retryBtn.textContent = `Retry selected (${n})`; }
    selectAll.checked = rows.length > 0 && rows.every((e) => selected.has(e.execution_id));
  }

  async function load() {
    if (loading || stopped) return;
    loading = true;
    try {
      const { data } = await call('GET', `/api/executions${query({ ...filters, limit: PAGE, cursor })}`, { tenant });
      if (stopped) return;
      rows = data.executions;
      totalEl.textContent = `${num(data.total)} matching`;
      totalEl.dataset.total = String(data.total);
      replace(pager,
        cursor ? h('a', { href: hashFor(filters, ''), class: 'button', id: 'page-first' }, 'First page') : null,
        data.next_cursor ? h('a', { href: hashFor(filters, data.next_cursor), class: 'button', id: 'page-next' }, 'Next page') : null);
      refreshState.textContent = `updated ${fmtTime(new Date().toISOString()).split(' ')[1]}`;
      drawRows();
    } catch (e) {
      if (!stopped && e instanceof ApiError && e.status !== 401) {
        refreshState.textContent = `not updated: ${e.message}`;
        if (e.status === 400) toast(e.message, 'error');
      }
    } finally {
      loading = false;
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = null;
    const secs = Number(refreshSel.value);
    if (stopped) return;
    if (secs <= 0) { refreshState.textContent = 'auto-refresh off'; return; }
    if (document.visibilityState === 'hidden') { refreshState.textContent = 'paused while hidden'; return; }
    timer = setTimeout(async () => { await load(); schedule(); }, secs * 1000);
  }
  const onVisibility = () => {
    if (document.visibilityState === 'visible') { load().then(schedule); } else { clearTimeout(timer); refreshState.textContent = 'paused while hidden'; }
  };
  document.addEventListener('visibilitychange', onVisibility);

  async function bulk(action) {
    const ids = [...selected];
    let ok = 0;
    const refused = [];
    for (const id of ids) {
      try {
        await call('POST', `/api/executions/${id}/${action}`, { tenant });
        ok++;
      } catch (e) {
        if (e.status === 401) return;
        refused.push(`${id.slice(0, 8)}…: ${e.code}`);
      }
    }
    selected.clear();
    const verb = action === 'cancel' ? 'Cancelled' : 'Retried';
    toast(`${verb} ${ok} of ${ids.length}.${refused.length ? ` Refused: ${refused.join(', ')}` : ''}`, refused.length ? 'error' : 'info');
    await load();
  }

  async function admit() {
    let params;
    try {
      params = JSON.parse(paramsField.value || '{}');
    } catch (e) {
      replace(admitResult, h('p', { class: 'error', id: 'admit-error' }, `Params are not JSON: ${e.message}`));
      return;
    }
    const body = { flow_id: flowField.value.trim(), params };
    if (versionField.value.trim()) body.version = versionField.value.trim();
    if (dedupField.value) body.dedup_key = dedupField.value;
    try {
      const { status, data } = await call('POST', '/api/executions', { tenant, body });
      if (status === 200 && data.deduplicated) {
        replace(admitResult, h('p', { class: 'notice replay', id: 'admit-replay' },
          'Replayed: dedup key ', h('code', {}, data.dedup_key), ' already started ', execLink(tenant, data.execution_id),
          ` (${data.status}); nothing new was admitted.`));
      } else {
        replace(admitResult, h('p', { class: 'notice ok', id: 'admit-created' }, 'Admitted ', execLink(tenant, data.execution_id), ` (${data.status}${data.queue_state ? `, ${data.queue_state}` : ''}).`));
      }
      await load();
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      if (e.status === 422 && e.code === 'idempotency_key_conflict') {
        replace(admitResult, h('p', { class: 'error', id: 'admit-conflict' },
          'Conflict: dedup key ', h('code', {}, body.dedup_key || ''), ' is held by ',
          e.problem.execution_id ? execLink(tenant, e.problem.execution_id) : 'another execution',
          ', admitted with a different flow, version or params.'));
      } else if (e.status === 429) {
        const after = e.headers && e.headers.get('Retry-After');
        replace(admitResult, h('p', { class: 'error', id: 'admit-queue-full' },
          `The tenant's queue is full (${e.code}): retry after ${after || '?'} s.`));
      } else if (e.status !== 401) {
        replace(admitResult, h('p', { class: 'error', id: 'admit-error' }, `${e.status} ${e.code}: ${e.message}`));
      }
    }
  }

  await load();
  schedule();
  return () => {
    stopped = true;
    clearTimeout(timer);
    document.removeEventListener('visibilitychange', onVisibility);
  };
}
