// Tenants (platform admin): the registry with limits, weight, live usage (running, waiting,
// scheduled), storage (logical bytes and retained executions against `max_bytes` and
// `max_retained`) and concurrency keys (overrides, blocked keys), register a tenant, edit its
// limits (`max_concurrent`, `max_queued`, `max_concurrent_per_key`, `max_bytes`,
// `max_retained`), its rate limits (`rate_limit`,
// `rate_limit_per_key`: starts per period, burst), its weight (its share of starts against the
// other tenants with runnable work) and `enabled`, delete it (typed confirmation; DELETE answers
// 204 when nothing of it is left, 202 while the rest is removed in the background). PUT changes
// only what it sends; an empty limit or weight field restores the server default (null; for
// `max_concurrent_per_key`, no per-key limit; for a rate limit, none). `?keys={tenant}` opens
// that tenant's concurrency keys: its per-key overrides with what each holds now, set one,
// delete one.

import { call, query } from '../api.js';
import { h, replace, toast, confirmDialog, field, num, fmtBytes, fmtTime } from '../dom.js';

/**
 * The API path of one concurrency key, or null for `.` and `..`: a browser's URL parser drops
 * those path segments (percent-encoded too), so the console cannot name them.
 */
function keyPath(tenant, key) {
  if (key === '.' || key === '..') return null;
  return `/api/tenants/${encodeURIComponent(tenant)}/concurrency-keys/${encodeURIComponent(key)}`;
}

/**
 * A tenant's storage as the page shows it: what it keeps against each bound, with the share
 * used, and when its oldest retained executions expire.
 */
export function storageText(t) {
  const s = t.storage;
  const pct = (n, of) => (of > 0 ? ` (${Math.floor((100 * n) / of)} %)` : '');
  const expiry = s.next_expiry ? `; oldest expire by ${fmtTime(s.next_expiry)}` : '';
  return `${fmtBytes(s.bytes)} of ${fmtBytes(t.max_bytes)}${pct(s.bytes, t.max_bytes)}, ` +
    `${num(s.retained)} of ${num(t.max_retained)} retained${pct(s.retained, t.max_retained)}${expiry}`;
}

/** A rate limit as the page shows it: `100 / 1m, burst 10`, or `—` for none. */
function fmtRate(r) {
  return r ? `${num(r.starts)} / ${r.per}, burst ${num(r.burst)}` : '—';
}

/**
 * The boxes of one rate limit of a tenant's row (`name`: `rate_limit` or `rate_limit_per_key`),
 * filled with its value now. `value()` is `{setting}` to send (null, no rate limit, when starts
 * and per are both empty; burst empty: the server's 1) or `{missing}` when only one is given.
 */
function rateBoxes(kind, name, tenant, r) {
  const starts = h('input', { type: 'number', min: 1, class: `edit-${kind}-starts`, value: r ? String(r.starts) : '', placeholder: 'starts', 'aria-label': `${name} starts of ${tenant}` });
  const per = h('input', { class: `edit-${kind}-per`, value: r ? r.per : '', placeholder: '1m', size: 5, spellcheck: 'false', 'aria-label': `${name} period of ${tenant}` });
  const burst = h('input', { type: 'number', min: 1, class: `edit-${kind}-burst`, value: r ? String(r.burst) : '', placeholder: '1', 'aria-label': `${name} burst of ${tenant}` });
  const el = h('span', { class: 'rate-boxes' }, starts, ' / ', per, ' burst ', burst);
  function value() {
    const s = starts.value;
    const p = per.value.trim();
    if (s === '' && p === '') return { setting: null };
    if (s === '' || p === '') return { missing: `${name} needs both starts and a period (both empty: none)` };
    const setting = { starts: Number(s), per: p };
    if (burst.value !== '') setting.burst = Number(burst.value);
    return { setting };
  }
  return { el, value };
}

export async function render(ctx) {
  const { main } = ctx;
  const cursor = ctx.route.params.get('cursor') || '';
  const keysOf = ctx.route.params.get('keys') || '';
  const hashWith = (keys) => `#/tenants${query({ cursor, keys })}`;
  const tbody = h('tbody', { id: 'tenants-body' });
  const pager = h('span', { class: 'pager' });

  const idIn = h('input', { id: 'new-tenant-id', required: true, placeholder: 'acme', spellcheck: 'false', pattern: '[A-Za-z0-9][A-Za-z0-9_.\\-]{0,63}' });
  const mcIn = h('input', { id: 'new-tenant-max-concurrent', type: 'number', min: 0, placeholder: 'server default' });
  const mqIn = h('input', { id: 'new-tenant-max-queued', type: 'number', min: 0, placeholder: 'server default' });
  const pkIn = h('input', { id: 'new-tenant-max-per-key', type: 'number', min: 1, placeholder: 'none', title: 'Executions of one concurrency key running at once, for every key without an override' });
  const wtIn = h('input', { id: 'new-tenant-weight', type: 'number', min: 1, max: 1000, placeholder: '1 (of 1–1000)', title: 'Share of starts against the other tenants with runnable work' });
  const mbIn = h('input', { id: 'new-tenant-max-bytes', type: 'number', min: 1, placeholder: 'server default', title: 'Logical bytes it may keep: 512 per execution + params + output + error message, until its terminal executions expire' });
  const mrIn = h('input', { id: 'new-tenant-max-retained', type: 'number', min: 1, placeholder: 'server default', title: 'Terminal executions it may keep until they expire' });
  const enIn = h('input', { id: 'new-tenant-enabled', type: 'checkbox', checked: true });
  const register = h('form', {
    id: 'register-tenant', class: 'inline-form',
    onsubmit: async (e) => {
      e.preventDefault();
      const id = idIn.value.trim();
      const body = { enabled: enIn.checked };
      if (mcIn.value !== '') body.max_concurrent = Number(mcIn.value);
      if (mqIn.value !== '') body.max_queued = Number(mqIn.value);
      if (pkIn.value !== '') body.max_concurrent_per_key = Number(pkIn.value);
      if (wtIn.value !== '') body.weight = Number(wtIn.value);
      if (mbIn.value !== '') body.max_bytes = Number(mbIn.value);
      if (mrIn.value !== '') body.max_retained = Number(mrIn.value);
      try {
        await call('PUT', `/api/tenants/${encodeURIComponent(id)}`, { body });
        toast(`Tenant ${id} saved.`);
        idIn.value = ''; mcIn.value = ''; mqIn.value = ''; pkIn.value = ''; wtIn.value = '';
        mbIn.value = ''; mrIn.value = '';
        await load();
      } catch (err) { if (err.status !== 401) toast(`Not saved: ${err.message}`, 'error'); }
    },
  }, field('Tenant id', idIn), field('max_concurrent', mcIn), field('max_queued', mqIn),
  field('max_concurrent_per_key', pkIn), field('Weight', wtIn), field('max_bytes', mbIn),
  field('max_retained', mrIn), field('Enabled', enIn),
  h('button', { type: 'submit', class: 'primary', id: 'register-submit' }, 'Register'));

  const keys = keysOf ? keysPanel(keysOf) : null;

  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Tenants')),
    h('section', { class: 'panel' }, h('h2', {}, 'Register a tenant'), register),
    keys ? keys.el : null,
    h('div', { class: 'toolbar' }, pager),
    h('div', { class: 'table-wrap' }, h('table', { class: 'grid', id: 'tenants-table' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Tenant'), h('th', {}, 'max_concurrent'), h('th', {}, 'max_queued'),
        h('th', { title: 'Executions of one concurrency key running at once, for every key without an override (empty: no per-key limit)' }, 'max_concurrent_per_key'),
        h('th', { title: 'Starts per period, of the tenant and of each of its concurrency keys: over the rate, executions wait in order (none is refused)' }, 'Rate limits'),
        h('th', { title: 'Share of starts against the other tenants with runnable work in its shard (1–1000; empty: 1)' }, 'Weight'),
        h('th', {}, 'Enabled'),
        h('th', {}, 'Usage'),
        h('th', { title: 'Logical bytes (512 per execution + params + output + error message) of its queued, running and retained executions against max_bytes, and its terminal executions kept until they expire against max_retained; at either bound its admissions answer 429 tenant_storage_full' }, 'Storage'),
        h('th', {}, 'Concurrency keys'), h('th', {}, ''))),
      tbody)));

  function row(t) {
    const enc = encodeURIComponent(t.tenant_id);
    const mc = h('input', { type: 'number', min: 0, class: 'edit-max-concurrent', value: String(t.max_concurrent), 'aria-label': `max_concurrent of ${t.tenant_id}` });
    const mq = h('input', { type: 'number', min: 0, class: 'edit-max-queued', value: String(t.max_queued), 'aria-label': `max_queued of ${t.tenant_id}` });
    const pk = h('input', { type: 'number', min: 1, class: 'edit-max-per-key', value: String(t.max_concurrent_per_key ?? ''), placeholder: 'none', 'aria-label': `max_concurrent_per_key of ${t.tenant_id}` });
    const wt = h('input', { type: 'number', min: 1, max: 1000, class: 'edit-weight', value: String(t.weight), placeholder: '1', 'aria-label': `weight of ${t.tenant_id}` });
    const en = h('input', { type: 'checkbox', class: 'edit-enabled', checked: t.enabled, 'aria-label': `enabled ${t.tenant_id}` });
    const mb = h('input', { type: 'number', min: 1, class: 'edit-max-bytes', value: String(t.max_bytes), 'aria-label': `max_bytes of ${t.tenant_id}` });
    const mr = h('input', { type: 'number', min: 1, class: 'edit-max-retained', value: String(t.max_retained), 'aria-label': `max_retained of ${t.tenant_id}` });
    const rate = rateBoxes('rate', 'rate_limit', t.tenant_id, t.rate_limit);
    const keyRate = rateBoxes('key-rate', 'rate_limit_per_key', t.tenant_id, t.rate_limit_per_key);
    const save = async () => {
      const rateIs = rate.value();
      const keyRateIs = keyRate.value();
      const missing = rateIs.missing || keyRateIs.missing;
      if (missing) { toast(`Not saved: ${missing}.`, 'error'); return; }
      const body = {
        max_concurrent: mc.value === '' ? null : Number(mc.value),
        max_queued: mq.value === '' ? null : Number(mq.value),
        max_concurrent_per_key: pk.value === '' ? null : Number(pk.value),
        rate_limit: rateIs.setting,
        rate_limit_per_key: keyRateIs.setting,
        weight: wt.value === '' ? null : Number(wt.value),
        max_bytes: mb.value === '' ? null : Number(mb.value),
        max_retained: mr.value === '' ? null : Number(mr.value),
        enabled: en.checked,
      };
      try {
        await call('PUT', `/api/tenants/${enc}`, { body });
        toast(`Tenant ${t.tenant_id} saved.`);
        await load();
      } catch (err) { if (err.status !== 401) toast(`Not saved: ${err.message}`, 'error'); }
    };
    const del = async () => {
      const ok = await confirmDialog({
        title: `Delete tenant ${t.tenant_id}?`,
        message: 'Its API keys are revoked and it admits nothing from now on. Everything it holds is removed: its executions (queued ones never start, running ones are told to stop, no webhook event is sent), dead letters, concurrency keys, trends and limits. The id can be registered again, empty, once that is done.',
        typed: t.tenant_id, action: 'Delete tenant', danger: true,
      });
      if (!ok) return;
      try {
        const { status } = await call('DELETE', `/api/tenants/${enc}`);
        toast(status === 202
          ? `Tenant ${t.tenant_id} is being deleted: what it holds is being removed; the id can be registered again once that is done.`
          : `Tenant ${t.tenant_id} deleted.`);
        await load();
      } catch (err) { if (err.status !== 401) toast(`Not deleted: ${err.message}`, 'error'); }
    };
    const ck = t.concurrency_keys;
    return h('tr', { dataset: { tenant: t.tenant_id } },
      h('td', {}, h('a', { href: `#/t/${enc}/executions` }, t.tenant_id),
        t.deleting ? [' ', h('span', { class: 'badge warn deleting', title: 'Being deleted: what it holds is being removed' }, 'deleting')] : null),
      h('td', {}, mc), h('td', {}, mq), h('td', {}, pk),
      h('td', { class: 'rates' },
        h('div', {}, h('span', { class: 'muted' }, 'tenant: '), h('span', { class: 'rate-limit' }, fmtRate(t.rate_limit))),
        h('div', {}, h('span', { class: 'muted' }, 'per key: '), h('span', { class: 'rate-limit-per-key' }, fmtRate(t.rate_limit_per_key))),
        h('details', { class: 'rate-edit' }, h('summary', { class: 'edit-rates' }, 'Edit'),
          h('div', { class: 'rate-fields' },
            h('span', { class: 'field-label' }, 'tenant'), rate.el,
            h('span', { class: 'field-label' }, 'per key'), keyRate.el,
            h('span', { class: 'hint' }, 'starts / period (250ms, 30s, 1m, 1h, 1d), burst (empty: 1); starts and period empty: none. Save applies.')))),
      h('td', {}, wt), h('td', {}, en),
      h('td', { class: 'usage' }, `running ${num(t.usage.running)}, waiting ${num(t.usage.waiting)}, scheduled ${num(t.usage.scheduled)}`),
      h('td', { class: 'storage', dataset: { bytes: String(t.storage.bytes), retained: String(t.storage.retained) } },
        h('div', { class: 'storage-usage' }, storageText(t)),
        h('details', { class: 'storage-edit' }, h('summary', { class: 'edit-storage' }, 'Edit'),
          h('div', { class: 'rate-fields' },
            h('span', { class: 'field-label' }, 'max_bytes'), mb,
            h('span', { class: 'field-label' }, 'max_retained'), mr,
            h('span', { class: 'hint' }, 'Empty: the server default. Save applies.')))),
      h('td', { class: 'ckey-counts', dataset: { overrides: String(ck.overrides), blocked: String(ck.blocked) } },
        h('a', { href: hashWith(t.tenant_id), class: 'show-ckeys', title: 'Its concurrency keys: the overrides, set or delete one' },
          `${num(ck.overrides)} ${ck.overrides === 1 ? 'override' : 'overrides'}`),
        ', ', h('span', { class: ck.blocked ? 'warn' : null, title: 'Keys at their limit with executions waiting behind it' }, `${num(ck.blocked)} blocked`)),
      h('td', { class: 'row-actions' },
        h('button', { type: 'button', class: 'save-tenant', onclick: save }, 'Save'),
        h('a', { href: `#/t/${enc}/api-keys`, class: 'button' }, 'Keys'),
        h('button', { type: 'button', class: 'danger delete-tenant', onclick: del }, 'Delete')));
  }

  /** One tenant's concurrency keys: the overrides with what each holds now; set, delete. */
  function keysPanel(tenant) {
    const keysBody = h('tbody', { id: 'ckeys-body' });
    const perKey = h('p', { id: 'ckeys-default', class: 'muted' });
    let defaultLimit = null;
    const keyIn = h('input', { id: 'ckey-name', required: true, placeholder: 'customer-7', spellcheck: 'false' });
    const maxIn = h('input', { id: 'ckey-max-concurrent', type: 'number', min: 0, required: true, placeholder: '2' });
    const form = h('form', {
      id: 'set-ckey', class: 'inline-form',
      onsubmit: async (e) => {
        e.preventDefault();
        const key = keyIn.value;
        const path = keyPath(tenant, key);
        if (!path) { toast(`Not saved: the key ${key} cannot be named in a URL path.`, 'error'); return; }
        try {
          const { data } = await call('PUT', path, { body: { max_concurrent: Number(maxIn.value) } });
          toast(data.max_concurrent === 0 ? `Key ${data.key} of ${tenant} held: none of its executions starts.`
            : `Key ${data.key} of ${tenant}: at most ${num(data.max_concurrent)} at once.`);
          keyIn.value = ''; maxIn.value = '';
          await load();
        } catch (err) { if (err.status !== 401) toast(`Not saved: ${err.message}`, 'error'); }
      },
    }, field('Concurrency key', keyIn), field('max_concurrent', maxIn, '0 holds the key: none of its executions starts'),
    h('button', { type: 'submit', class: 'primary', id: 'set-ckey-submit' }, 'Set limit'));

    const el = h('section', { class: 'panel ckeys', id: 'concurrency-keys' },
      h('div', { class: 'toolbar' }, h('h2', {}, `Concurrency keys of ${tenant}`), h('div', { class: 'spacer' }),
        h('a', { href: hashWith(''), class: 'button', id: 'ckeys-close' }, 'Close')),
      perKey, form,
      h('div', { class: 'table-wrap' }, h('table', { class: 'grid', id: 'ckeys-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Key'), h('th', { title: 'Its executions running at once (0: held)' }, 'max_concurrent'),
          h('th', {}, 'Running'), h('th', { title: 'Runnable, not started yet (scheduled ones are not counted)' }, 'Queued'), h('th', {}, ''))),
        keysBody)));

    function keyRow(k) {
      const path = keyPath(tenant, k.key);
      const del = async () => {
        const ok = await confirmDialog({
          title: `Delete the override of key ${k.key}?`,
          message: defaultLimit === null
            ? 'The key runs without a limit of its own again (only the tenant\'s max_concurrent applies).'
            : `The tenant's max_concurrent_per_key (${num(defaultLimit)}) applies to the key again.`,
          action: 'Delete override', danger: true,
        });
        if (!ok) return;
        try {
          await call('DELETE', path);
          toast(`Override of key ${k.key} deleted.`);
          await load();
        } catch (err) { if (err.status !== 401) toast(`Not deleted: ${err.message}`, 'error'); }
      };
      return h('tr', { dataset: { key: k.key } },
        h('td', { class: 'mono ckey' }, k.key),
        h('td', { class: 'ckey-limit', dataset: { limit: String(k.max_concurrent ?? '') } },
          k.max_concurrent === 0 ? '0 (held)' : num(k.max_concurrent)),
        h('td', { class: 'ckey-running' }, num(k.running)),
        h('td', { class: 'ckey-queued' }, num(k.queued)),
        h('td', { class: 'row-actions' },
          h('button', {
            type: 'button', class: 'edit-ckey',
            onclick: () => { keyIn.value = k.key; maxIn.value = String(k.max_concurrent ?? ''); maxIn.focus(); },
          }, 'Edit'),
          h('button', {
            type: 'button', class: 'danger delete-ckey', onclick: del, disabled: !path,
            title: path ? null : 'A key named . or .. cannot be named in a URL path',
          }, 'Delete')));
    }

    async function loadKeys() {
      const { data } = await call('GET', `/api/tenants/${encodeURIComponent(tenant)}/concurrency-keys`);
      defaultLimit = data.max_concurrent_per_key;
      perKey.textContent = (defaultLimit === null
        ? 'A key without an override has no limit of its own (max_concurrent_per_key is not set): only the tenant\'s max_concurrent applies.'
        : `A key without an override runs at most ${num(defaultLimit)} at once (max_concurrent_per_key).`) +
        ` ${num(data.keys.length)} ${data.keys.length === 1 ? 'override' : 'overrides'} (at most 10,000).`;
      replace(keysBody, data.keys.length === 0
        ? h('tr', {}, h('td', { colspan: 5, class: 'empty', id: 'no-ckeys' }, 'No key has an override.'))
        : data.keys.map(keyRow));
    }

    return { el, body: keysBody, load: loadKeys };
  }

  async function loadTenants() {
    const { data } = await call('GET', `/api/tenants${query({ limit: 50, cursor })}`);
    replace(tbody, data.tenants.length === 0 ? h('tr', {}, h('td', { colspan: 11, class: 'empty' }, 'No registered tenants.')) : data.tenants.map(row));
    replace(pager,
      cursor ? h('a', { href: `#/tenants${query({ keys: keysOf })}`, class: 'button' }, 'First page') : null,
      data.next_cursor ? h('a', { href: `#/tenants${query({ cursor: data.next_cursor, keys: keysOf })}`, class: 'button', id: 'page-next' }, 'Next page') : null);
  }

  /** The tenants and, when open, the concurrency keys (a change to either shows in both). */
  async function load() {
    await Promise.all([loadTenants(), keys ? keys.load() : null]);
  }

  try { await loadTenants(); } catch (e) { if (e.status !== 401) replace(tbody, h('tr', {}, h('td', { colspan: 11, class: 'error' }, e.message))); }
  if (keys) {
    try { await keys.load(); } catch (e) { if (e.status !== 401) replace(keys.body, h('tr', {}, h('td', { colspan: 5, class: 'error' }, e.message))); }
  }
  return null;
}
