// Executions of one tenant: filters kept in the URL (status, scheduled only, flow, dedup key,
// time range, cursor), `total`, cursor paging, each row's priority, concurrency key, due time
// and, while it waits to start, its place in the queue, auto-refresh at a chosen interval
// (paused while the tab is hidden), bulk cancel/retry of the selected rows, and the New
// execution form (concurrency key; priority; start now, after a delay or at a time) with every
// answer an admission can get (201, 200 replay, 422 conflict, 429 with Retry-After), and its
// Dry run (`POST /api/executions/dry-run`: what admission would do now, nothing admitted); New batch opens the
// batch admission panel (batch.js).

import { call, query, ApiError, isTerminal } from '../api.js';
import { h, replace, fmtTime, toInputTime, fromInputTime, statusBadge, toast, field, num } from '../dom.js';
import { batchPanel } from './batch.js';

const STATUSES = ['queued', 'running', 'completed', 'failed', 'cancelled'];
const PAGE = 50;
const INTERVALS = [['0', 'off'], ['2', '2 s'], ['5', '5 s'], ['10', '10 s'], ['30', '30 s']];
/** `priority` on admission: 1 starts first within the tenant, 3 when not given. */
const PRIORITIES = [['1', '1 (first)'], ['2', '2'], ['3', '3 (default)'], ['4', '4'], ['5', '5 (last)']];
/** Statuses a `scheduled` filter may go with (a scheduled execution is queued). */
const SCHEDULED_STATUSES = new Set(['', 'queued']);

function refreshSetting() {
  const v = localStorage.getItem('sluice.refresh');
  return INTERVALS.some(([k]) => k === v) ? v : '5';
}

export function execLink(tenant, id, text) {
  return h('a', { href: `#/t/${encodeURIComponent(tenant)}/executions/${id}`, class: 'mono exec-link', dataset: { id } }, text || id);
}

/**
 * How far ahead an RFC 3339 time is, for a due time: `in 40 s`, `in 4 min`, `in 2 h 5 min`,
 * `in 3 d 1 h`; `due` once passed (a due execution starts as soon as a worker and its tenant's
 * share allow).
 */
export function fmtUntil(iso) {
  const ms = Date.parse(iso) - Date.now();
  if (Number.isNaN(ms)) return '';
  if (ms <= 0) return 'due';
  const s = Math.ceil(ms / 1000);
  if (s < 90) return `in ${s} s`;
  const m = Math.round(s / 60);
  if (m < 90) return `in ${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `in ${hours} h${m % 60 ? ` ${m % 60} min` : ''}`;
  return `in ${Math.floor(hours / 24)} d${hours % 24 ? ` ${hours % 24} h` : ''}`;
}

/**
 * Where a waiting execution stands (`queue_position`: how many start before it), in words:
 * `next in the tenant`, `3 ahead in the tenant, next in its key`; '' without a position.
 */
export function fmtPosition(pos) {
  if (!pos) return '';
  const ahead = (n, where) => (n === 0 ? `next in ${where}` : `${num(n)} ahead in ${where}`);
  return ahead(pos.tenant, 'the tenant') + (pos.key === null || pos.key === undefined ? '' : `, ${ahead(pos.key, 'its key')}`);
}

/**
 * When a waiting execution is expected to start (`estimated_start`): before p50 about half the
 * time, before p90 nine times in ten; '' without an estimate (its tenant's pace not measured).
 */
export function fmtEstimate(est) {
  if (!est) return '';
  return `expected to start ~${fmtTime(est.p50)} (90 %: ${fmtTime(est.p90)})`;
}

/** What a dry run's `reason` means, for the user who asked. */
const DRY_RUN_REASONS = {
  ready: 'it would start as soon as a worker picks it',
  tenant_at_max_concurrent: 'it would wait: the tenant runs its max_concurrent already',
  key_at_limit: 'it would wait: its concurrency key runs its limit already',
  tenant_throttled: 'it would wait: the tenant\'s rate limit allows no start now',
  key_throttled: 'it would wait: its concurrency key\'s rate limit allows no start now',
  scheduled: 'it would be scheduled: not due yet',
  same_request: 'a replay: the dedup key names a live execution with the same request',
  idempotency_key_conflict: 'admission would answer 422: the dedup key is held by a different request',
  tenant_disabled: 'admission would answer 403: the tenant is disabled',
  tenant_queue_full: 'admission would answer 429: the tenant\'s queue is full',
};

/**
 * A "start" choice for a form: now, after a delay (the API's duration grammar, checked by the
 * server) or at a date-time (a `datetime-local` read in the chosen time mode, sent as RFC 3339
 * UTC). `value()` is `{}`, `{delay}` or `{run_at}`, or `{missing}` with what to ask for.
 */
export function scheduleControl(prefix, { now = true, initial = 'now', at = '' } = {}) {
  const choices = [['delay', 'after a delay'], ['at', 'at a time']];
  if (now) choices.unshift(['now', 'now']);
  const when = h('select', { id: `${prefix}-when`, 'aria-label': 'Start' },
    choices.map(([v, l]) => h('option', { value: v, selected: v === initial }, l)));
  const delay = h('input', { id: `${prefix}-delay`, placeholder: '30s, 5m, 2h, 1d', size: 10, spellcheck: 'false', 'aria-label': 'Delay' });
  const runAt = h('input', { id: `${prefix}-run-at`, type: 'datetime-local', step: 1, value: at, 'aria-label': 'Start at' });
  const show = () => { delay.hidden = when.value !== 'delay'; runAt.hidden = when.value !== 'at'; };
  when.addEventListener('change', () => { show(); (when.value === 'delay' ? delay : runAt).focus(); });
  show();
  const el = h('span', { class: 'schedule-pick' }, when, delay, runAt);
  function value() {
    if (when.value === 'delay') {
      const d = delay.value.trim();
      return d ? { delay: d } : { missing: 'a delay, such as 30s, 5m, 2h or 1d' };
    }
    if (when.value === 'at') {
      const t = fromInputTime(runAt.value);
      return t ? { run_at: t } : { missing: 'a date and time' };
    }
    return {};
  }
  return { el, when, delay, runAt, value };
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
    queue_state: p.get('queue') === 'scheduled' ? 'scheduled' : '',
  };
  const cursor = p.get('cursor') || '';
  const base = `#/t/${encodeURIComponent(tenant)}/executions`;
  const hashFor = (f, c) => base + query({
    status: f.status, queue: f.queue_state, flow: f.flow_id, dedup: f.dedup_key, from: f.created_from, before: f.created_before, cursor: c,
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
  // Scheduled (queued, not due yet) is a queue state: with it, only "queued" or any status.
  const scheduledIn = h('input', {
    id: 'filter-scheduled', type: 'checkbox', checked: filters.queue_state === 'scheduled',
    onchange: () => limitStatuses(),
  });
  function limitStatuses() {
    for (const o of statusSel.options) o.disabled = scheduledIn.checked && !SCHEDULED_STATUSES.has(o.value);
    if (scheduledIn.checked && !SCHEDULED_STATUSES.has(statusSel.value)) statusSel.value = 'queued';
  }
  limitStatuses();
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
        queue_state: scheduledIn.checked ? 'scheduled' : '',
      }, '');
    },
  },
  field('Status', statusSel), field('Scheduled only', scheduledIn, 'not due yet'), field('Flow', flowIn), field('Dedup key', dedupIn),
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
  const batch = can.admit ? batchPanel(tenant, (id) => execLink(tenant, id), () => load()) : null;
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
      h('th', {}, 'Execution'), h('th', {}, 'Flow'), h('th', {}, 'Status'),
      h('th', { title: '1 starts first within the tenant' }, 'Priority'), h('th', {}, 'Attempt'),
      h('th', {}, 'Dedup key'),
      h('th', { title: 'What it competes for inside the tenant: a key runs at most its limit at once' }, 'Concurrency key'),
      h('th', {}, 'Created'), h('th', { title: 'Its earliest start (run_at)' }, 'Due'))),
    tbody);

  // New execution.
  const flowField = h('input', { id: 'admit-flow', name: 'flow_id', required: true, placeholder: 'demo.echo', spellcheck: 'false' });
  const versionField = h('input', { id: 'admit-version', name: 'version', placeholder: 'optional', spellcheck: 'false' });
  const paramsField = h('textarea', { id: 'admit-params', name: 'params', rows: 5, spellcheck: 'false' });
  paramsField.value = '{}';
  const dedupField = h('input', { id: 'admit-dedup', name: 'dedup_key', placeholder: 'optional', spellcheck: 'false' });
  const keyField = h('input', { id: 'admit-ckey', name: 'concurrency_key', placeholder: 'optional', spellcheck: 'false' });
  const priorityField = h('select', { id: 'admit-priority', name: 'priority' },
    PRIORITIES.map(([v, l]) => h('option', { value: v, selected: v === '3' }, l)));
  const startField = scheduleControl('admit');
  const startHint = h('span', { class: 'hint' }, 'until due it is queued and scheduled: it holds its dedup key and takes no slot');
  const showStartHint = () => { startHint.hidden = startField.when.value === 'now'; };
  startField.when.addEventListener('change', showStartHint);
  showStartHint();
  const admitResult = h('div', { id: 'admit-result', role: 'status', 'aria-live': 'polite' });
  const admitPanel = h('section', { class: 'panel', id: 'admit-panel', hidden: true },
    h('h2', {}, 'New execution'),
    h('form', {
      id: 'admit-form', class: 'admit',
      onsubmit: (e) => { e.preventDefault(); admit(); },
    },
    field('Flow', flowField), field('Version', versionField),
    field('Params (JSON object)', paramsField), field('Dedup key', dedupField, 'the same key with the same request returns the same execution'),
    field('Concurrency key', keyField, 'e.g. its end customer: executions of one key run at most the key\'s limit at once'),
    field('Priority', priorityField, 'orders this tenant\'s own executions: 1 first, FIFO within a priority'),
    h('div', { class: 'field' }, h('span', { class: 'field-label' }, 'Start'), startField.el, startHint),
    h('div', { class: 'row-actions' }, h('button', { type: 'submit', class: 'primary', id: 'admit-submit' }, 'Admit'),
      h('button', {
        type: 'button', id: 'admit-dry-run-submit', onclick: () => dryRun(),
        title: 'What admission would do with this request now, without admitting it',
      }, 'Dry run'))),
    admitResult);

  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Executions'), h('span', { class: 'muted' }, ` tenant ${tenant}`), h('div', { class: 'spacer' }),
      batch && batch.button, newBtn),
    admitPanel,
    batch && batch.panel,
    h('section', { class: 'panel' }, filterForm),
    h('div', { class: 'toolbar' }, totalEl, pager, h('div', { class: 'spacer' }), cancelBtn, retryBtn, refreshSel, refreshState),
    h('div', { class: 'table-wrap' }, table));

  function fromInput(input) { return fromInputTime(input.value); }

  function drawRows() {
    const checkable = can.cancel || can.retry;
    replace(tbody, rows.length === 0
      ? h('tr', {}, h('td', { colspan: checkable ? 10 : 9, class: 'empty', id: 'no-executions' }, 'No executions match.'))
      : rows.map((e) => h('tr', { dataset: { id: e.execution_id, status: e.status, queueState: e.queue_state || '' } },
        checkable ? h('td', { class: 'check' }, h('input', {
          type: 'checkbox', class: 'row-select', 'aria-label': `Select ${e.execution_id}`, checked: selected.has(e.execution_id),
          onchange: (ev) => { if (ev.target.checked) selected.add(e.execution_id); else selected.delete(e.execution_id); updateBulk(); },
        })) : null,
        h('td', {}, execLink(tenant, e.execution_id)),
        h('td', { class: 'flow' }, e.flow_id, e.version ? h('span', { class: 'muted' }, ` @${e.version}`) : null),
        h('td', { class: 'status' }, statusBadge(e.status, e.queue_state || (e.cancel_requested && !isTerminal(e.status) ? 'cancel requested' : null)),
          queuePosition(e)),
        h('td', { class: 'priority' }, String(e.priority)),
        h('td', {}, `${e.attempt}/${e.max_attempts}`),
        h('td', { class: 'dedup' }, e.dedup_key ?? ''),
        h('td', { class: 'ckey' }, e.concurrency_key ?? ''),
        h('td', { class: 'time' }, fmtTime(e.created_at)),
        h('td', { class: 'time due', dataset: { runAt: e.run_at || '' } }, dueCell(e)))));
    updateBulk();
  }

  /** A waiting row's place in its tenant's queue, compact (the full words as its title). */
  function queuePosition(e) {
    const pos = e.queue_position;
    if (!pos) return null;
    return h('span', {
      class: 'queue-pos muted', dataset: { ahead: String(pos.tenant) },
      title: [fmtPosition(pos), fmtEstimate(e.estimated_start)].filter(Boolean).join('; '),
    }, pos.tenant === 0 ? 'next' : `${num(pos.tenant)} ahead`);
  }

  /** The due time; with how far ahead while it is still scheduled. */
  function dueCell(e) {
    if (!e.run_at) return '—';
    return [h('span', { class: 'due-time' }, fmtTime(e.run_at)),
      e.queue_state === 'scheduled' ? h('span', { class: 'muted due-in' }, ` ${fmtUntil(e.run_at)}`) : null];
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

  /** The admission the form describes, or null after saying in the result what is wrong. */
  function requestBody() {
    let params;
    try {
      params = JSON.parse(paramsField.value || '{}');
    } catch (e) {
      replace(admitResult, h('p', { class: 'error', id: 'admit-error' }, `Params are not JSON: ${e.message}`));
      return null;
    }
    const start = startField.value();
    if (start.missing) {
      replace(admitResult, h('p', { class: 'error', id: 'admit-error' }, `To start later, give ${start.missing}.`));
      return null;
    }
    const body = { flow_id: flowField.value.trim(), params, priority: Number(priorityField.value), ...start };
    if (versionField.value.trim()) body.version = versionField.value.trim();
    if (dedupField.value) body.dedup_key = dedupField.value;
    if (keyField.value) body.concurrency_key = keyField.value;
    return body;
  }

  async function admit() {
    const body = requestBody();
    if (!body) return;
    try {
      const { status, data } = await call('POST', '/api/executions', { tenant, body });
      if (status === 200 && data.deduplicated) {
        replace(admitResult, h('p', { class: 'notice replay', id: 'admit-replay' },
          'Replayed: dedup key ', h('code', {}, data.dedup_key), ' already started ', execLink(tenant, data.execution_id),
          ` (${data.status}); nothing new was admitted.`));
      } else {
        const due = data.queue_state === 'scheduled' && data.run_at ? `, due ${fmtTime(data.run_at)}` : '';
        const key = data.concurrency_key ? `, concurrency key ${data.concurrency_key}` : '';
        replace(admitResult, h('p', { class: 'notice ok', id: 'admit-created' }, 'Admitted ', execLink(tenant, data.execution_id),
          ` (${data.status}${data.queue_state ? `, ${data.queue_state}` : ''}, priority ${data.priority}${key}${due}).`));
      }
      await load();
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      if (e.status === 422 && e.code === 'idempotency_key_conflict') {
        replace(admitResult, h('p', { class: 'error', id: 'admit-conflict' },
          'Conflict: dedup key ', h('code', {}, body.dedup_key || ''), ' is held by ',
          e.problem.execution_id ? execLink(tenant, e.problem.execution_id) : 'another execution',
          ', admitted with a different flow, version, params or concurrency key.'));
      } else if (e.status === 429) {
        const after = e.headers && e.headers.get('Retry-After');
        replace(admitResult, h('p', { class: 'error', id: 'admit-queue-full' },
          `The tenant's queue is full (${e.code}): retry after ${after || '?'} s.`));
      } else if (e.status !== 401) {
        replace(admitResult, h('p', { class: 'error', id: 'admit-error' }, `${e.status} ${e.code}: ${e.message}`));
      }
    }
  }

  /** The same request to `POST /api/executions/dry-run`: what admission would do now; nothing
   * is written. */
  async function dryRun() {
    const body = requestBody();
    if (!body) return;
    try {
      const { data: d } = await call('POST', '/api/executions/dry-run', { tenant, body });
      const pos = fmtPosition(d.queue_position);
      const eta = fmtEstimate(d.estimated_start);
      replace(admitResult, h('p', { class: 'notice dry-run', id: 'admit-dry-run', dataset: { decision: d.decision, reason: d.reason } },
        h('strong', {}, 'Dry run: '), h('span', { class: 'dry-decision' }, d.decision),
        ' (', h('code', { class: 'dry-reason' }, d.reason), ')',
        DRY_RUN_REASONS[d.reason] ? ` — ${DRY_RUN_REASONS[d.reason]}` : null,
        d.execution_id ? [': ', execLink(tenant, d.execution_id)] : null,
        d.run_at ? [', due ', h('span', { class: 'dry-run-at' }, fmtTime(d.run_at))] : null, '.',
        pos ? [' Position: ', h('span', { class: 'dry-position' }, pos)] : null,
        eta ? [pos ? ' · ' : ' ', h('span', { class: 'dry-eta' }, eta)] : null, pos || eta ? '.' : null,
        d.retry_after !== null && d.retry_after !== undefined
          ? [' Retry after ', h('span', { class: 'dry-retry-after' }, String(d.retry_after)), ' s.'] : null,
        ' Nothing was admitted.'));
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      if (e.status !== 401) {
        replace(admitResult, h('p', { class: 'error', id: 'admit-error' }, `Dry run: ${e.status} ${e.code}: ${e.message}`));
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
