// A tenant's API keys (its admin key or the platform admin): create one (the token is shown
// once, with a copy button), list them (never a token), revoke one (its next request is 401).

import { call } from '../api.js';
import { h, replace, fmtTime, toast, confirmDialog, field } from '../dom.js';

export async function render(ctx) {
  const { tenant, main } = ctx;
  const enc = encodeURIComponent(tenant);
  const tbody = h('tbody', { id: 'api-keys-body' });
  const created = h('div', { id: 'created-key' });

  const roleSel = h('select', { id: 'new-key-role' }, ['viewer', 'editor', 'admin', 'worker'].map((r) => h('option', { value: r }, r)));
  const nameIn = h('input', { id: 'new-key-name', placeholder: 'optional', maxlength: 64 });
  const form = h('form', {
    id: 'create-key', class: 'inline-form',
    onsubmit: async (e) => {
      e.preventDefault();
      const body = { role: roleSel.value };
      if (nameIn.value.trim()) body.name = nameIn.value.trim();
      try {
        const { data } = await call('POST', `/api/tenants/${enc}/api-keys`, { body });
        showToken(data);
        nameIn.value = '';
        await load();
      } catch (err) { if (err.status !== 401) toast(`Not created: ${err.message}`, 'error'); }
    },
  }, field('Role', roleSel), field('Name', nameIn), h('button', { type: 'submit', class: 'primary', id: 'create-key-submit' }, 'Create key'));

  replace(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'API keys'), h('span', { class: 'muted' }, ` tenant ${tenant}`)),
    h('section', { class: 'panel' }, h('h2', {}, 'Create a key'), form, created),
    h('div', { class: 'table-wrap' }, h('table', { class: 'grid', id: 'api-keys-table' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Key id'), h('th', {}, 'Role'), h('th', {}, 'Name'), h('th', {}, 'Created'), h('th', {}, ''))),
      tbody)));

  function showToken(k) {
    const tokenEl = h('input', { id: 'new-key-token', readonly: true, value: k.token, size: 90, class: 'mono', 'aria-label': 'New token' });
    const copy = h('button', {
      type: 'button', id: 'copy-token',
      onclick: async () => {
        tokenEl.select();
        try {
          await navigator.clipboard.writeText(k.token);
          toast('Token copied.');
        } catch (e) {
          toast('Copying was refused by the browser: the token is selected, copy it with Ctrl+C.', 'error');
        }
      },
    }, 'Copy');
    replace(created, h('div', { class: 'notice ok' },
      h('p', {}, `Key ${k.key_id} (${k.role}) created. Its token is shown only now:`),
      h('div', { class: 'row-actions' }, tokenEl, copy),
      h('button', { type: 'button', onclick: () => replace(created) }, 'I have stored it')));
  }

  async function load() {
    const { data } = await call('GET', `/api/tenants/${enc}/api-keys`);
    replace(tbody, data.api_keys.length === 0
      ? h('tr', {}, h('td', { colspan: 5, class: 'empty' }, 'No keys.'))
      : data.api_keys.map((k) => h('tr', { dataset: { key: k.key_id } },
        h('td', { class: 'mono' }, k.key_id), h('td', {}, k.role), h('td', {}, k.name ?? ''), h('td', { class: 'time' }, fmtTime(k.created_at)),
        h('td', {}, ctx.me.key_id === k.key_id ? h('span', { class: 'muted' }, 'this session') : null,
          h('button', {
            type: 'button', class: 'danger revoke-key',
            onclick: async () => {
              const ok = await confirmDialog({ title: `Revoke key ${k.key_id}?`, message: 'Its next request is refused (401). This cannot be undone.', action: 'Revoke', danger: true });
              if (!ok) return;
              try {
                await call('DELETE', `/api/tenants/${enc}/api-keys/${k.key_id}`);
                toast(`Key ${k.key_id} revoked.`);
                await load();
              } catch (err) { if (err.status !== 401) toast(`Not revoked: ${err.message}`, 'error'); }
            },
          }, 'Revoke')))));
  }

  try { await load(); } catch (e) { if (e.status !== 401) replace(tbody, h('tr', {}, h('td', { colspan: 5, class: 'error' }, e.message))); }
  return null;
}
