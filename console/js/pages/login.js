// The login page: paste a platform admin token or a tenant API key (`sk_...`). It is kept in
// sessionStorage only (see api.js) and checked with GET /api/me by the shell.

import { setToken } from '../api.js';
import { h, replace } from '../dom.js';

export function render({ main, message, onLogin }) {
  const input = h('input', {
    id: 'login-token', type: 'password', name: 'token', autocomplete: 'off', spellcheck: 'false',
    placeholder: 'sk_… or the platform admin token', required: true, size: 60,
  });
  const form = h('form', {
    id: 'login-form', class: 'panel narrow',
    onsubmit: (e) => {
      e.preventDefault();
      const t = input.value.trim();
      if (!t) return;
      setToken(t);
      onLogin();
    },
  },
  h('h1', {}, 'Sign in'),
  h('p', { class: 'muted' }, 'Paste a tenant API key or the platform admin token. It is kept in this tab only (sessionStorage) and sent to this server alone.'),
  message ? h('p', { class: 'error', id: 'login-error', role: 'alert' }, message) : null,
  h('label', { class: 'field' }, h('span', { class: 'field-label' }, 'Token'), input),
  h('div', { class: 'row-actions' }, h('button', { type: 'submit', class: 'primary', id: 'login-submit' }, 'Sign in')));
  replace(main, form);
  input.focus();
}
