// Tenants (platform admin): the registry with limits, weight and live usage (running, waiting,
// scheduled), register a tenant, edit its limits, its weight (its share of starts against the
// other tenants with runnable work) and `enabled`, delete it (typed confirmation). PUT changes
// only what it sends; an empty limit or weight field restores the server default (null).

import { call, query } from '../api.js';
import { h, replace, toast, confirmDialog, field, num } from '../dom.js';

export async function render(ctx) {
  const { main } = ctx;
  const cursor = ctx.route.params.get('cursor') || '';
  const tbody = h('tbody', { id: 'tenants-body' });
  const pager = h('span', { class: 'pager' });

  const idIn = h('input', { id: 'new-tenant-id', required: true, placeholder: 'acme', spellcheck: 'false', pattern: '[A-Za-z0-9][A-Za-z0-9_.\\-]{0,63}' });
  const mcIn = h('input', { id: 'new-tenant-max-concurrent', type: 'number', min: 0, placeholder: 'server default' });
  const mqIn = h('input', { id: 'new-tenant-max-queued', type: 'number', min: 0, placeholder: 'server default' });
  const wtIn = h('input', { id: 'new-tenant-weight', type: 'number', min: 1, max: 1000, placeholder: '1 (of 1–1000)', title: 'Share of starts against the other tenants with runnable work' });
  const enIn = h('input', { id: 'new-tenant-enabled', type: 'checkbox', checked: true });
  const register = h('form', {
    id: 'register-tenant', class: 'inline-form',
    onsubmit: async (e) => {
      e.preventDefault();
      const id = idIn.value.trim();
      const body = { enabled: enIn.checked };
      if (mcIn.value !== '') body.max_concurrent = Number(mcIn.value);
      if (mqIn.value !== '') body.max_queued = Number(mqIn.value);
      if (wtIn.value !== '') body.weight = Number(wtIn.value);
      try {
        await call('PUT', `/api/tenants/${encodeURIComponent(id)}`, { body });
        toast(`Tenant ${id} saved.`);
        idIn.value = ''; mcIn.value = ''; mqIn.value = ''; wtIn.value = '';
        await load();
      } catch (err) { if (err.status !== 401) toast(`Not saved: ${err.message}`, 'error'); }
    },
  }, field('Tenant id', idIn), field('max_concurrent', mcIn), field('max_queued', mqIn),
  field('Weight', wtIn), field('Enabled', enIn),
  h('button', { type: 'submit', class: 'primary', id: 'register-submit' }, 'Register'));

  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Tenants')),
    h('section', { class: 'panel' }, h('h2', {}, 'Register a tenant'), register),
    h('div', { class: 'toolbar' }, pager),
    h('div', { class: 'table-wrap' }, h('table', { class: 'grid', id: 'tenants-table' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Tenant'), h('th', {}, 'max_concurrent'), h('th', {}, 'max_queued'),
        h('th', { title: 'Share of starts against the other tenants with runnable work in its shard (1–1000; empty: 1)' }, 'Weight'),
        h('th', {}, 'Enabled'),
        h('th', {}, 'Usage'), h('th', {}, ''))),
      tbody)));

  function row(t) {
    const enc = encodeURIComponent(t.tenant_id);
    const mc = h('input', { type: 'number', min: 0, class: 'edit-max-concurrent', value: String(t.max_concurrent), 'aria-label': `max_concurrent of ${t.tenant_id}` });
    const mq = h('input', { type: 'number', min: 0, class: 'edit-max-queued', value: String(t.max_queued), 'aria-label': `max_queued of ${t.tenant_id}` });
    const wt = h('input', { type: 'number', min: 1, max: 1000, class: 'edit-weight', value: String(t.weight), placeholder: '1', 'aria-label': `weight of ${t.tenant_id}` });
    const en = h('input', { type: 'checkbox', class: 'edit-enabled', checked: t.enabled, 'aria-label': `enabled ${t.tenant_id}` });
    const save = async () => {
      const body = {
        max_concurrent: mc.value === '' ? null : Number(mc.value),
        max_queued: mq.value === '' ? null : Number(mq.value),
        weight: wt.value === '' ? null : Number(wt.value),
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
        message: 'It is unregistered, all its API keys are revoked and its limits dropped (the server defaults apply). Its executions run their course and expire.',
        typed: t.tenant_id, action: 'Delete tenant', danger: true,
      });
      if (!ok) return;
      try {
        await call('DELETE', `/api/tenants/${enc}`);
        toast(`Tenant ${t.tenant_id} deleted.`);
        await load();
      } catch (err) { if (err.status !== 401) toast(`Not deleted: ${err.message}`, 'error'); }
    };
    return h('tr', { dataset: { tenant: t.tenant_id } },
      h('td', {}, h('a', { href: `#/t/${enc}/executions` }, t.tenant_id)),
      h('td', {}, mc), h('td', {}, mq), h('td', {}, wt), h('td', {}, en),
      h('td', { class: 'usage' }, `running ${num(t.usage.running)}, waiting ${num(t.usage.waiting)}, scheduled ${num(t.usage.scheduled)}`),
      h('td', { class: 'row-actions' },
        h('button', { type: 'button', class: 'save-tenant', onclick: save }, 'Save'),
        h('a', { href: `#/t/${enc}/api-keys`, class: 'button' }, 'Keys'),
        h('button', { type: 'button', class: 'danger delete-tenant', onclick: del }, 'Delete')));
  }

  async function load() {
    const { data } = await call('GET', `/api/tenants${query({ limit: 50, cursor })}`);
    replace(tbody, data.tenants.length === 0 ? h('tr', {}, h('td', { colspan: 7, class: 'empty' }, 'No registered tenants.')) : data.tenants.map(row));
    replace(pager,
      cursor ? h('a', { href: '#/tenants', class: 'button' }, 'First page') : null,
      data.next_cursor ? h('a', { href: `#/tenants${query({ cursor: data.next_cursor })}`, class: 'button', id: 'page-next' }, 'Next page') : null);
  }

  try { await load(); } catch (e) { if (e.status !== 401) replace(tbody, h('tr', {}, h('td', { colspan: 7, class: 'error' }, e.message))); }
  return null;
}
