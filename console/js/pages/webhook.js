// A tenant's webhook (its admin key or the platform admin): the address its executions'
// terminal changes are POSTed to, how their delivery goes (pending, delivered, failed
// attempts, dropped) and the log of the last attempts, so a tenant can see why its receiver
// hears nothing without reading the server's logs. The signing secret is shown once, when it
// is made (the first address, or a rotation), as a new API key's token is: the API never
// answers it again. Removing the webhook drops the events not delivered yet, so it asks first.

import { call, query } from '../api.js';
import { h, replace, fmtTime, toast, confirmDialog, field, num } from '../dom.js';
import { execLink } from './executions.js';

/** Delivery attempts listed (the server keeps the last 200 or so). */
const LOG = 50;

export async function render(ctx) {
  const { tenant, main } = ctx;
  const path = `/api/tenants/${encodeURIComponent(tenant)}/webhook`;
  /** The webhook as last read, or null when the tenant has none. */
  let current = null;

  const state = h('div', { id: 'webhook-state' }, h('p', { class: 'muted' }, 'Loading…'));
  const secretBox = h('div', { id: 'webhook-secret-box', class: 'secret-once' });
  const formError = h('p', { class: 'error', id: 'webhook-error', role: 'alert', hidden: true });
  const urlIn = h('input', { id: 'webhook-url-input', class: 'mono', size: 60, maxlength: 2048, required: true, spellcheck: 'false', autocomplete: 'off' });
  const rotateIn = h('input', { id: 'webhook-rotate', type: 'checkbox' });
  const rotateField = field('Rotate secret', rotateIn);
  const submit = h('button', { type: 'submit', class: 'primary', id: 'webhook-submit' }, 'Set webhook');
  const formTitle = h('h2', {}, 'Set the address');
  const form = h('form', { id: 'webhook-form', class: 'inline-form', onsubmit: save },
    field('Address', urlIn, 'An absolute https or http address; an https receiver needs a certificate the server trusts (public CAs, or --webhook-ca-file). Loopback and private addresses are refused unless the server runs with --webhook-allow-private.'),
    rotateField, submit);
  const tbody = h('tbody', { id: 'webhook-deliveries-body' });

  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Webhook'), h('span', { class: 'muted' }, ` tenant ${tenant}`)),
    h('p', { class: 'muted' }, 'Each execution of this tenant that completes, fails, is cancelled or force-deleted is POSTed to the address as a JSON event, signed with the webhook\'s secret (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature). An event is sent again until the receiver answers 2xx, with the same webhook-id: drop duplicates by it.'),
    h('section', { class: 'panel' }, h('h2', {}, 'Current webhook'), state),
    h('section', { class: 'panel' }, formTitle, form, formError, secretBox),
    h('section', { class: 'panel deliveries' },
      h('div', { class: 'toolbar' }, h('h2', {}, 'Deliveries'), h('span', { class: 'muted' }, `the last ${LOG} attempts, newest first`),
        h('div', { class: 'spacer' }),
        h('button', { type: 'button', id: 'webhook-refresh', onclick: refresh }, 'Refresh')),
      h('div', { class: 'table-wrap' }, h('table', { class: 'grid', id: 'webhook-deliveries' },
        h('thead', {}, h('tr', {}, h('th', {}, 'When'), h('th', {}, 'Type'), h('th', {}, 'Execution'), h('th', {}, 'Result'),
          h('th', {}, 'HTTP status'), h('th', {}, 'Error'), h('th', {}, 'Duration'), h('th', {}, 'Attempt'))),
        tbody))));

  /** Shows the webhook read last; `fill` puts its address in the form (not while the user edits it). */
  function showCurrent(fill) {
    if (!current) {
      replace(state, h('p', { id: 'no-webhook' }, 'No webhook: this tenant\'s terminal changes are not sent anywhere. Set an address below to start.'));
      formTitle.textContent = 'Set the address';
      submit.textContent = 'Set webhook';
      rotateField.hidden = true;
      rotateIn.checked = false;
      if (fill) urlIn.value = '';
      return;
    }
    const w = current;
    replace(state,
      h('dl', { class: 'facts', id: 'webhook-facts' },
        h('dt', {}, 'Address'), h('dd', { id: 'webhook-url', class: 'mono' }, w.url),
        h('dt', {}, 'Created'), h('dd', { id: 'webhook-created', class: 'time' }, fmtTime(w.created_at)),
        h('dt', {}, 'Pending'), h('dd', { id: 'webhook-pending', dataset: { count: String(w.pending) } }, num(w.pending),
          h('span', { class: 'muted' }, ' waiting to be delivered, or sent again after a failure')),
        h('dt', {}, 'Delivered'), h('dd', { id: 'webhook-delivered', dataset: { count: String(w.delivered) } }, num(w.delivered)),
        h('dt', {}, 'Failed attempts'), h('dd', { id: 'webhook-failed', dataset: { count: String(w.failed_attempts) } }, num(w.failed_attempts),
          h('span', { class: 'muted' }, ' each one is in the log below')),
        h('dt', {}, 'Dropped'), h('dd', { id: 'webhook-dropped', dataset: { count: String(w.dropped) } }, num(w.dropped),
          h('span', { class: 'muted' }, ' never delivered: evicted from a full outbox, or too old')),
        h('dt', {}, 'Last delivered'), h('dd', { id: 'webhook-last-delivered', class: 'time' }, fmtTime(w.last_delivered_at))),
      h('div', { class: 'row-actions' },
        h('button', { type: 'button', class: 'danger', id: 'webhook-remove', onclick: remove }, 'Remove webhook')));
    formTitle.textContent = 'Change the address';
    submit.textContent = 'Save';
    rotateField.hidden = false;
    if (fill) urlIn.value = w.url;
  }

  function showError(message) {
    formError.textContent = message;
    formError.hidden = !message;
  }

  function showSecret(w) {
    const secretEl = h('input', { id: 'webhook-secret', readonly: true, value: w.secret, size: 60, class: 'mono', 'aria-label': 'Signing secret' });
    const copy = h('button', {
      type: 'button', id: 'copy-secret',
      onclick: async () => {
        secretEl.select();
        try {
          await navigator.clipboard.writeText(w.secret);
          toast('Secret copied.');
        } catch (e) {
          toast('Copying was refused by the browser: the secret is selected, copy it with Ctrl+C.', 'error');
        }
      },
    }, 'Copy');
    replace(secretBox, h('div', { class: 'notice ok' },
      h('p', {}, 'The signing secret is shown only now: copy it to the receiver, which checks each delivery\'s webhook-signature with it. It cannot be read again; if it is lost, rotate it.'),
      h('div', { class: 'row-actions' }, secretEl, copy),
      h('button', { type: 'button', onclick: () => replace(secretBox) }, 'I have stored it')));
  }

  async function save(e) {
    e.preventDefault();
    showError('');
    const body = { url: urlIn.value.trim() };
    if (current && rotateIn.checked) body.rotate_secret = true;
    try {
      const { data } = await call('PUT', path, { body });
      current = data;
      showCurrent(true);
      rotateIn.checked = false;
      if (data.secret) showSecret(data);
      else replace(secretBox);
      toast(data.secret ? 'Webhook set, with a new secret.' : 'Webhook saved; its secret is unchanged.');
    } catch (err) {
      if (err.status !== 401) showError(`Not saved: ${err.message}`);
    }
  }

  async function remove() {
    const pending = current ? current.pending : 0;
    const ok = await confirmDialog({
      title: `Remove the webhook of ${tenant}?`,
      message: 'No event is written for it from now on, and the events not delivered yet are dropped '
        + `(${num(pending)} when last read). Its secret goes too: an address set later gets a new one.`,
      action: 'Remove', danger: true,
    });
    if (!ok) return;
    try {
      await call('DELETE', path);
      toast('Webhook removed.');
    } catch (err) {
      if (err.status === 401) return;
      if (err.code !== 'webhook_not_found') { toast(`Not removed: ${err.message}`, 'error'); return; }
    }
    replace(secretBox);
    await refresh(true);
  }

  async function loadWebhook(fill) {
    try {
      current = (await call('GET', path)).data;
    } catch (err) {
      if (err.code !== 'webhook_not_found') throw err;
      current = null;
    }
    showCurrent(fill);
  }

  async function loadDeliveries() {
    const { data } = await call('GET', `${path}/deliveries${query({ limit: LOG })}`);
    replace(tbody, data.deliveries.length === 0
      ? h('tr', {}, h('td', { colspan: 8, class: 'empty', id: 'no-deliveries' }, 'No delivery attempts yet.'))
      : data.deliveries.map((d) => h('tr', { class: 'delivery', dataset: { execution: d.execution_id, webhookId: d.webhook_id, delivered: String(d.delivered) } },
        h('td', { class: 'time' }, fmtTime(d.at)),
        h('td', { class: 'type' }, d.type),
        h('td', {}, execLink(tenant, d.execution_id)),
        h('td', { class: 'result' }, d.delivered
          ? h('span', { class: 'badge st-completed' }, 'delivered')
          : h('span', { class: 'badge st-failed' }, 'failed')),
        h('td', { class: 'http-status' }, d.status ?? '—'),
        h('td', { class: 'message' }, d.error ?? ''),
        h('td', { class: 'duration' }, `${num(d.duration_ms)} ms`),
        h('td', { class: 'attempt' }, String(d.attempt)))));
  }

  /** Reads the webhook's counts and its log again; `fill` as in showCurrent. */
  async function refresh(fill) {
    const [hook, log] = await Promise.allSettled([loadWebhook(fill === true), loadDeliveries()]);
    if (hook.status === 'rejected' && hook.reason.status !== 401) replace(state, h('p', { class: 'error' }, hook.reason.message));
    if (log.status === 'rejected' && log.reason.status !== 401) {
      replace(tbody, h('tr', {}, h('td', { colspan: 8, class: 'error' }, log.reason.message)));
    }
  }

  await refresh(true);
  return null;
}
