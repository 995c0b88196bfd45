// Batch admission from the executions page: a JSON array of items, each the body New execution
// sends, admitted by one `POST /api/executions/batch`, and its answer item by item — the
// status, the execution (a replay marked) or the problem — under a count of what was admitted,
// replayed and not admitted. Each item is atomic, the batch is not: the panel says so.

import { call, ApiError } from '../api.js';
import { h, replace, field } from '../dom.js';

const EXAMPLE = `[
  {"flow_id": "demo.echo", "params": {"n": 1}, "dedup_key": "order-1"},
  {"flow_id": "demo.echo", "params": {"n": 2}, "priority": 1}
]`;

/**
 * The New batch button and the panel it opens, for `tenant`. `link(id)` renders a link to an
 * execution; `loaded()` reloads the list below once a batch was answered.
 */
export function batchPanel(tenant, link, loaded) {
  const itemsField = h('textarea', { id: 'batch-items', rows: 8, spellcheck: 'false' });
  itemsField.value = EXAMPLE;
  const result = h('div', { id: 'batch-result', role: 'status', 'aria-live': 'polite' });
  const submit = h('button', { type: 'submit', class: 'primary', id: 'batch-submit' }, 'Admit batch');
  const panel = h('section', { class: 'panel', id: 'batch-panel', hidden: true },
    h('h2', {}, 'New batch'),
    h('form', { id: 'batch-form', class: 'admit', onsubmit: (e) => { e.preventDefault(); send(); } },
      field('Items (a JSON array of 1 to 1,000)', itemsField,
        'each item is what New execution sends and is admitted on its own: the batch is not atomic, and a repeated dedup key is a replay'),
      h('div', { class: 'row-actions' }, submit)),
    result);
  const button = h('button', {
    id: 'new-batch', type: 'button',
    onclick: () => { panel.hidden = !panel.hidden; if (!panel.hidden) itemsField.focus(); },
  }, 'New batch');

  const failed = (text) => replace(result, h('p', { class: 'error', id: 'batch-error' }, text));

  async function send() {
    let items;
    try {
      items = JSON.parse(itemsField.value);
    } catch (e) {
      failed(`Items are not JSON: ${e.message}`);
      return;
    }
    if (!Array.isArray(items)) {
      failed('Items must be a JSON array of admissions.');
      return;
    }
    submit.disabled = true;
    try {
      const { data } = await call('POST', '/api/executions/batch', { tenant, body: { items } });
      const results = data.results;
      const admitted = results.filter((r) => r.status === 201).length;
      const replayed = results.filter((r) => r.status === 200).length;
      const refused = results.length - admitted - replayed;
      const rows = results.map((r, i) => h('tr', { class: 'batch-item', dataset: { status: String(r.status) } },
        h('td', {}, String(i + 1)),
        h('td', {}, String(r.status)),
        h('td', {}, r.execution
          ? [link(r.execution.execution_id), r.status === 200 ? ' (replay: an earlier execution of its dedup key)' : null]
          : h('span', { class: 'error' }, `${r.problem.code}: ${r.problem.detail}`))));
      replace(result,
        h('p', { class: refused ? 'notice replay' : 'notice ok', id: 'batch-summary', dataset: { admitted, replayed, refused } },
          `${admitted} admitted, ${replayed} replayed, ${refused} not admitted.`),
        h('table', { class: 'grid', id: 'batch-results' },
          h('thead', {}, h('tr', {}, h('th', {}, '#'), h('th', {}, 'Status'), h('th', {}, 'Execution or problem'))),
          h('tbody', {}, rows)));
      await loaded();
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      if (e.status !== 401) failed(`${e.status} ${e.code}: ${e.message}`);
    } finally {
      submit.disabled = false;
    }
  }

  return { button, panel };
}
