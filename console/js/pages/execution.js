// One execution: status, queue state, priority, due time, attempts, concurrency key, a
// timeline, params/output/error as text, its dead letters, and Cancel / Retry / Force delete as
// the role allows, with Reschedule (after a delay or at a time) while it is still scheduled.
// While it waits to start: its place in the queue and when it is expected to start. Live until
// terminal: it follows GET /api/executions/{id}/events (SSE read with fetch) and redraws on
// each change; while it has a place in the queue it is also read again every few seconds, as
// that place moves when others start (no event of its own says so).

import { call, followExecution, isTerminal, ApiError } from '../api.js';
import { h, replace, fmtTime, toInputTime, statusBadge, jsonBlock, toast, confirmDialog } from '../dom.js';
import { fmtUntil, fmtPosition, fmtEstimate, scheduleControl } from './executions.js';

/** How often a waiting execution's place and expected start are read again. */
const POSITION_EVERY_MS = 5000;

export async function render(ctx) {
  const { tenant, can, main } = ctx;
  const id = ctx.route.id;
  const listHref = `#/t/${encodeURIComponent(tenant)}/executions`;
  const abort = new AbortController();
  const seen = [];
  let current = null;
  let deadLetters = [];
  let positionTimer = null;

  if (!/^[0-9a-f]{32}$/.test(id)) {
    replace(main, h('section', { class: 'panel' }, h('h1', {}, 'Not an execution id'), h('p', {}, 'An execution id is 32 lowercase hex characters.')));
    return null;
  }

  // Built once, so a redraw by a streamed event keeps what the user is typing.
  const moveTo = scheduleControl('reschedule', { now: false, initial: 'delay' });
  let prefilled = null;
  const rescheduleForm = h('form', {
    id: 'reschedule-form', class: 'inline-form reschedule',
    onsubmit: (ev) => { ev.preventDefault(); reschedule(); },
  }, h('span', { class: 'field-label' }, 'Move the start to'), moveTo.el,
  h('button', { id: 'action-reschedule', type: 'submit' }, 'Reschedule'));

  const liveEl = h('span', { id: 'live', class: 'live' });
  const body = h('div', { id: 'execution' });
  replace(main,
    h('div', { class: 'page-head' },
      h('a', { href: listHref, class: 'button', id: 'back-to-list' }, '← Executions'),
      h('h1', { class: 'mono' }, id), liveEl),
    body);

  function record(e) {
    const last = seen[seen.length - 1];
    const label = e.status + (e.queue_state ? ` (${e.queue_state})` : '') + (e.cancel_requested && !isTerminal(e.status) ? ' (cancel requested)' : '');
    if (!last || last.label !== label) seen.push({ label, at: e.updated_at });
  }

  function draw() {
    const e = current;
    if (!e) return;
    const actions = h('div', { class: 'row-actions', id: 'actions' });
    if (can.cancel && !isTerminal(e.status) && !e.cancel_requested) {
      actions.append(h('button', { id: 'action-cancel', type: 'button', onclick: cancel }, 'Cancel'));
    }
    if (can.retry && (e.status === 'failed' || e.status === 'cancelled')) {
      actions.append(h('button', { id: 'action-retry', type: 'button', onclick: retry }, 'Retry'));
    }
    if (can.forceDelete) {
      actions.append(h('button', { id: 'action-force-delete', type: 'button', class: 'danger', onclick: forceDelete }, 'Force delete'));
    }
    const scheduled = e.status === 'queued' && e.queue_state === 'scheduled';
    if (e.run_at !== prefilled) {
      // The date-time box starts at the current due time, the nearest edit a user makes.
      prefilled = e.run_at;
      moveTo.runAt.value = toInputTime(e.run_at);
    }
    const pos = e.queue_position;
    const times = [['created', e.created_at], ['due', e.run_at], ['started', e.started_at], ['finished', e.finished_at], ['updated', e.updated_at]];
    replace(body,
      h('section', { class: 'panel' },
        h('dl', { class: 'facts' },
          h('dt', {}, 'Status'), h('dd', { id: 'detail-status' }, statusBadge(e.status)),
          h('dt', {}, 'Queue state'), h('dd', { id: 'detail-queue-state' }, e.queue_state || '—'),
          pos ? [h('dt', {}, 'Position'), h('dd', { id: 'detail-position', dataset: { tenant: String(pos.tenant), key: String(pos.key ?? '') } },
            h('span', { class: 'position' }, fmtPosition(pos)),
            e.estimated_start ? h('span', { id: 'detail-eta', dataset: { p50: e.estimated_start.p50, p90: e.estimated_start.p90 } },
              ` · ${fmtEstimate(e.estimated_start)}`) : null)] : null,
          h('dt', {}, 'Priority'), h('dd', { id: 'detail-priority' }, String(e.priority),
            h('span', { class: 'muted' }, ' (1 starts first within the tenant)')),
          h('dt', {}, 'Due'), h('dd', { id: 'detail-run-at', dataset: { runAt: e.run_at || '' } },
            e.run_at ? h('span', { class: 'due-time' }, fmtTime(e.run_at)) : '— (not scheduled)',
            scheduled ? h('span', { class: 'muted' }, ` ${fmtUntil(e.run_at)}`) : null),
          h('dt', {}, 'Cancel requested'), h('dd', {}, e.cancel_requested ? 'yes' : 'no'),
          h('dt', {}, 'Attempt'), h('dd', { id: 'detail-attempt' }, `${e.attempt} of ${e.max_attempts}`),
          h('dt', {}, 'Flow'), h('dd', { id: 'detail-flow' }, e.flow_id, e.version ? ` @${e.version}` : ''),
          h('dt', {}, 'Dedup key'), h('dd', { id: 'detail-dedup' }, e.dedup_key ?? '—'),
          h('dt', {}, 'Concurrency key'), h('dd', { id: 'detail-concurrency-key' }, e.concurrency_key ?? '—'),
          h('dt', {}, 'Trace'), h('dd', { id: 'detail-trace' },
            e.traceparent ? h('code', {}, e.traceparent) : '—',
            e.tracestate ? h('span', { class: 'muted' }, ` ${e.tracestate}`) : null),
          h('dt', {}, 'Tenant'), h('dd', {}, e.tenant_id)),
        actions,
        can.reschedule && scheduled ? rescheduleForm : null),
      h('section', { class: 'panel' },
        h('h2', {}, 'Timeline'),
        h('ol', { class: 'timeline', id: 'timeline' },
          times.filter(([, t]) => t).map(([what, t]) => h('li', {}, h('span', { class: 'time' }, fmtTime(t)), ` ${what}`))),
        seen.length > 1 ? h('div', {}, h('h3', {}, 'Seen live'),
          h('ol', { class: 'timeline', id: 'seen-live' }, seen.map((s) => h('li', {}, h('span', { class: 'time' }, fmtTime(s.at)), ` ${s.label}`)))) : null),
      h('section', { class: 'panel' }, h('h2', {}, 'Params'), jsonBlock(e.params, { id: 'detail-params' })),
      e.output !== null && e.output !== undefined
        ? h('section', { class: 'panel' }, h('h2', {}, 'Output'), jsonBlock(e.output, { id: 'detail-output' })) : null,
      e.error ? h('section', { class: 'panel' }, h('h2', {}, 'Error'),
        h('p', { id: 'detail-error' }, h('code', {}, e.error.kind), ': ', e.error.message)) : null,
      h('section', { class: 'panel' }, h('h2', {}, 'Dead letters'),
        deadLetters.length === 0 ? h('p', { class: 'muted', id: 'detail-no-dead-letters' }, 'None among the tenant\'s 200 newest dead letters.')
          : h('table', { class: 'grid', id: 'detail-dead-letters' },
            h('thead', {}, h('tr', {}, h('th', {}, 'When'), h('th', {}, 'Reason'), h('th', {}, 'Attempts'), h('th', {}, 'Message'))),
            h('tbody', {}, deadLetters.map((d) => h('tr', {},
              h('td', {}, fmtTime(d.dead_lettered_at)), h('td', {}, d.reason), h('td', {}, String(d.attempts)), h('td', {}, d.message)))))));
    liveEl.textContent = isTerminal(e.status) ? '' : '● live';
  }

  function gone() {
    abort.abort();
    liveEl.textContent = '';
    replace(body, h('section', { class: 'panel' }, h('p', { id: 'detail-gone' }, 'This execution does not exist (or was force-deleted).'),
      h('a', { href: listHref, class: 'button' }, 'Back to the list')));
  }

  async function loadDeadLetters() {
    try {
      const { data } = await call('GET', '/api/dlq?limit=200', { tenant });
      deadLetters = data.dead_letters.filter((d) => d.execution_id === id);
    } catch (e) {
      deadLetters = [];
    }
  }

  /** Whether `e` is older than what is shown (an answer overtaken by a streamed event). */
  function stale(e) {
    if (!current) return false;
    const now = Date.parse(current.updated_at);
    const then = Date.parse(e.updated_at);
    return then < now || (then === now && isTerminal(current.status) && !isTerminal(e.status));
  }

  function update(e) {
    if (stale(e)) return;
    const wasTerminal = current && isTerminal(current.status);
    current = e;
    record(e);
    draw();
    followPosition();
    if (isTerminal(e.status) && !wasTerminal) loadDeadLetters().then(() => { if (!abort.signal.aborted) draw(); });
  }

  /** While it has a place in the queue, reads it again in a while (not while the tab is hidden). */
  function followPosition() {
    clearTimeout(positionTimer);
    if (abort.signal.aborted || !current || !current.queue_position) return;
    positionTimer = setTimeout(async () => {
      if (document.visibilityState !== 'hidden') {
        try {
          const { data } = await call('GET', `/api/executions/${id}`, { tenant, signal: abort.signal });
          if (!abort.signal.aborted) update(data);
        } catch (e) {
          // The stream follows it still (and tells a delete): try again later.
        }
      }
      followPosition();
    }, POSITION_EVERY_MS);
  }

  function follow() {
    followExecution(tenant, id, {
      onExecution: (e) => { if (!abort.signal.aborted) update(e); },
      onDeleted: () => { if (!abort.signal.aborted) gone(); },
      onError: (err) => { if (!abort.signal.aborted) toast(`Live updates stopped: ${err.message}`, 'error'); },
      signal: abort.signal,
    }).finally(() => { if (!abort.signal.aborted && current) liveEl.textContent = ''; });
  }

  async function cancel() {
    try {
      const { data } = await call('POST', `/api/executions/${id}/cancel`, { tenant });
      update(data);
      toast(data.status === 'cancelled' ? 'Cancelled.' : 'Cancel requested; its worker stops it.');
    } catch (e) { if (e.status !== 401) toast(`Cancel refused: ${e.message}`, 'error'); }
  }

  async function retry() {
    try {
      const { data } = await call('POST', `/api/executions/${id}/retry`, { tenant });
      update(data);
      toast('Queued again.');
      follow();
    } catch (e) { if (e.status !== 401) toast(`Retry refused: ${e.message}`, 'error'); }
  }

  async function reschedule() {
    const to = moveTo.value();
    if (to.missing) { toast(`To reschedule, give ${to.missing}.`, 'error'); return; }
    try {
      const { data } = await call('POST', `/api/executions/${id}/reschedule`, { tenant, body: to });
      update(data);
      moveTo.delay.value = '';
      toast(data.queue_state === 'scheduled' ? `Rescheduled: due ${fmtTime(data.run_at)}.` : 'Rescheduled: due now.');
    } catch (e) { if (e.status !== 401) toast(`Reschedule refused: ${e.message}`, 'error'); }
  }

  async function forceDelete() {
    const typed = id.slice(0, 8);
    const ok = await confirmDialog({
      title: 'Force delete this execution?',
      message: 'It is terminalized now, its slot and dedup key are released and its row is deleted. This cannot be undone.',
      typed, action: 'Force delete', danger: true,
    });
    if (!ok) return;
    try {
      await call('DELETE', `/api/executions/${id}?force=true`, { tenant });
      toast('Deleted.');
      location.hash = listHref;
    } catch (e) { if (e.status !== 401) toast(`Delete refused: ${e.message}`, 'error'); }
  }

  try {
    const { data } = await call('GET', `/api/executions/${id}`, { tenant });
    if (isTerminal(data.status)) await loadDeadLetters();
    current = data;
    record(data);
    draw();
    followPosition();
    if (!isTerminal(data.status)) follow();
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) gone();
    else if (!(e instanceof ApiError) || e.status !== 401) replace(body, h('p', { class: 'error' }, e.message));
  }
  return () => { abort.abort(); clearTimeout(positionTimer); };
}
