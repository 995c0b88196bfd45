// The console's shell: who is signed in (GET /api/me), the hash router, the header (tenant,
// navigation, jump-to-id, theme and time settings) and each page's lifecycle. Pages are
// modules exporting `render(ctx)`, which fills `ctx.main` and may return a cleanup function
// (timers, streams) that runs when the user leaves the page.

import { call, token, clearToken, ApiError } from './api.js';
import { h, replace, settings, toast } from './dom.js';
import * as login from './pages/login.js';
import * as executions from './pages/executions.js';
import * as execution from './pages/execution.js';
import * as deadLetters from './pages/dead_letters.js';
import * as overview from './pages/overview.js';
import * as tenants from './pages/tenants.js';
import * as apiKeys from './pages/api_keys.js';
import * as webhook from './pages/webhook.js';
import * as trends from './pages/trends.js';

/**
 * What the signed-in caller may do, as the server itself lists it (`GET /api/me`, `may`): pages
 * offer only these actions, and the console keeps no copy of the roles' rules.
 */
export function abilities(me) {
  const may = new Set(me.may || []);
  return {
    admit: may.has('admit'),
    cancel: may.has('cancel'),
    retry: may.has('retry'),
    reschedule: may.has('reschedule'),
    dismiss: may.has('dismiss_dead_letters'),
    forceDelete: may.has('force_delete'),
    manageKeys: may.has('manage_api_keys'),
    webhook: may.has('manage_webhook'),
    trends: may.has('read_trends'),
    platform: may.has('manage_platform'),
  };
}

const state = { me: null, cleanup: null, renderSeq: 0 };
const root = document.getElementById('app');

function applyTheme() {
  const t = settings.theme;
  if (t === 'system') document.documentElement.removeAttribute('data-theme');
  else document.documentElement.setAttribute('data-theme', t);
}

/** Splits `#/a/b?x=1` into path segments and query parameters. */
function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const [path, q] = raw.split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(q || '') };
}

/** Where a caller starts. */
function home(me) {
  if (abilities(me).platform && !me.tenant_id) return '#/overview';
  return `#/t/${encodeURIComponent(me.tenant_id)}/executions`;
}

function route(me) {
  const { parts, params } = parseHash();
  const can = abilities(me);
  if (parts[0] === 't' && parts[1]) {
    const tenant = parts[1];
    if (!can.platform && tenant !== me.tenant_id) {
      return { page: notAllowed, tenant: me.tenant_id, why: `This key belongs to tenant ${me.tenant_id}.` };
    }
    if (parts[2] === 'executions' && parts[3]) return { page: execution, tenant, id: parts[3], params };
    if (parts[2] === 'executions') return { page: executions, tenant, params };
    if (parts[2] === 'dead-letters') return { page: deadLetters, tenant, params };
    if (parts[2] === 'trends') {
      return can.trends ? { page: trends, tenant, params }
        : { page: notAllowed, tenant, why: 'A tenant\'s trends need the admin role.' };
    }
    if (parts[2] === 'api-keys') {
      return can.manageKeys ? { page: apiKeys, tenant, params }
        : { page: notAllowed, tenant, why: 'Managing API keys needs the admin role.' };
    }
    if (parts[2] === 'webhook') {
      return can.webhook ? { page: webhook, tenant, params }
        : { page: notAllowed, tenant, why: 'A tenant\'s webhook needs the admin role.' };
    }
  }
  if (parts[0] === 'overview') {
    return can.platform ? { page: overview, params } : { page: notAllowed, why: 'The overview is for the platform admin.' };
  }
  if (parts[0] === 'tenants') {
    return can.platform ? { page: tenants, params } : { page: notAllowed, why: 'Tenants are managed by the platform admin.' };
  }
  if (parts[0] === 'dead-letters') {
    return can.platform ? { page: deadLetters, tenant: null, params } : { page: notAllowed, why: 'Every tenant\'s dead letters are for the platform admin.' };
  }
  return null;
}

const notAllowed = {
  render(ctx) {
    replace(ctx.main, h('section', { class: 'panel' }, h('h1', {}, 'Not available'), h('p', { id: 'not-allowed' }, ctx.route.why)));
  },
};

function header(me, current) {
  const can = abilities(me);
  const tenant = current.tenant || me.tenant_id || '';
  const t = encodeURIComponent(tenant);
  const link = (href, text, id) => h('a', { href, id, class: location.hash.startsWith(href) ? 'active' : null }, text);
  const nav = h('nav', { class: 'nav' });
  if (can.platform) {
    nav.append(link('#/overview', 'Overview', 'nav-overview'), link('#/tenants', 'Tenants', 'nav-tenants'));
  }
  if (tenant) {
    nav.append(link(`#/t/${t}/executions`, 'Executions', 'nav-executions'),
      link(`#/t/${t}/dead-letters`, 'Dead letters', 'nav-dead-letters'));
    if (can.trends) nav.append(link(`#/t/${t}/trends`, 'Trends', 'nav-trends'));
    if (can.manageKeys) nav.append(link(`#/t/${t}/api-keys`, 'API keys', 'nav-api-keys'));
    if (can.webhook) nav.append(link(`#/t/${t}/webhook`, 'Webhook', 'nav-webhook'));
  } else if (can.platform) {
    nav.append(link('#/dead-letters', 'Dead letters', 'nav-dead-letters'));
  }

  const tenantBox = can.platform
    ? h('form', {
      class: 'tenant-pick',
      onsubmit: (e) => {
        e.preventDefault();
        const v = e.target.elements.tenant.value.trim();
        if (v) location.hash = `#/t/${encodeURIComponent(v)}/executions`;
      },
    }, h('input', { name: 'tenant', id: 'tenant-input', placeholder: 'tenant', value: tenant, 'aria-label': 'Tenant', size: 10 }))
    : h('span', { class: 'tenant-fixed', id: 'tenant-name' }, tenant);

  const jump = h('form', {
    class: 'jump',
    onsubmit: (e) => {
      e.preventDefault();
      const v = e.target.elements.id.value.trim().toLowerCase();
      if (!/^[0-9a-f]{32}$/.test(v)) { toast('An execution id is 32 hex characters.', 'error'); return; }
      if (!tenant) { toast('Choose a tenant first.', 'error'); return; }
      location.hash = `#/t/${t}/executions/${v}`;
    },
  }, h('input', { name: 'id', id: 'jump-input', placeholder: 'jump to execution id', 'aria-label': 'Jump to execution id', size: 22, spellcheck: 'false' }));

  const theme = h('select', {
    id: 'theme-select', 'aria-label': 'Theme',
    onchange: (e) => { settings.theme = e.target.value; applyTheme(); },
  }, [['system', 'system theme'], ['dark', 'dark'], ['light', 'light']].map(([v, l]) => h('option', { value: v, selected: settings.theme === v }, l)));
  const time = h('select', {
    id: 'time-select', 'aria-label': 'Times',
    onchange: (e) => { settings.timeMode = e.target.value; render(); },
  }, [['local', 'local time'], ['utc', 'UTC']].map(([v, l]) => h('option', { value: v, selected: settings.timeMode === v }, l)));

  const who = h('span', { class: 'who', id: 'who' },
    h('span', { class: `role role-${me.role}`, id: 'who-role' }, me.role.replace('_', ' ')),
    me.key_id ? h('span', { class: 'muted' }, ` key ${me.key_id}`) : null,
    me.auth === 'dev_auth' ? h('span', { class: 'warn' }, ' dev auth') : null);
  const logout = me.auth === 'dev_auth' ? null : h('button', {
    id: 'logout', type: 'button',
    onclick: () => { clearToken(); state.me = null; location.hash = '#/login'; boot(); },
  }, 'Sign out');

  return h('header', { class: 'top' },
    h('a', { class: 'brand', href: home(me) }, 'sluice'),
    tenantBox, nav, h('div', { class: 'spacer' }), jump, theme, time, who, logout);
}

async function render() {
  const seq = ++state.renderSeq;
  if (state.cleanup) { try { state.cleanup(); } catch (e) { /* a page's cleanup failing must not block the next */ } }
  state.cleanup = null;
  if (!state.me) return;
  const me = state.me;
  const r = route(me);
  if (!r) { location.replace(home(me)); return; }
  const main = h('main', { id: 'main' });
  replace(root, header(me, r), main);
  const ctx = { me, can: abilities(me), route: r, tenant: r.tenant, main, rerender: render, isCurrent: () => seq === state.renderSeq };
  const cleanup = await r.page.render(ctx);
  if (seq === state.renderSeq) state.cleanup = cleanup || null;
  else if (cleanup) cleanup();
}

function showLogin(message) {
  if (state.cleanup) { try { state.cleanup(); } catch (e) { /* ignore */ } }
  state.cleanup = null;
  state.me = null;
  const main = h('main', { id: 'main' });
  replace(root, h('header', { class: 'top' }, h('span', { class: 'brand' }, 'sluice')), main);
  login.render({ main, message, onLogin: () => boot() });
}

/**
 * Whether this server runs with --dev-auth (no login), from /console/session.json; null when
 * that cannot be read (then the probe below finds out, and says so if the server is down).
 */
async function devAuth() {
  try {
    const res = await fetch('/console/session.json', { cache: 'no-store' });
    return res.ok ? (await res.json()).dev_auth === true : null;
  } catch (e) {
    return null;
  }
}

/** Finds out who the caller is, then shows the page the URL names (or the login). */
async function boot() {
  applyTheme();
  // Without a token only a dev-auth server accepts GET /api/me: ask which kind this is first,
  // so a first visit shows the login without a refused request in the browser's console.
  if (!token() && (await devAuth()) === false) {
    showLogin(null);
    return;
  }
  try {
    const { data } = await call('GET', '/api/me');
    state.me = data;
    if (!location.hash || location.hash === '#/login' || location.hash === '#/') location.replace(home(data));
    await render();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      const hadToken = !!token();
      clearToken();
      showLogin(hadToken ? 'That token was not accepted (unknown, revoked or mistyped).' : null);
    } else if (e instanceof ApiError && e.status === 403) {
      // A worker key: valid, but it reaches only the pull API (/api/worker/*).
      clearToken();
      showLogin('That is a worker key: it reaches only the pull API (/api/worker/*), not the console. Sign in with a viewer, editor or admin key.');
    } else {
      replace(root, h('main', { id: 'main' }, h('section', { class: 'panel' }, h('h1', {}, 'sluice is not answering'), h('p', {}, e.message))));
    }
  }
}

window.addEventListener('hashchange', () => { if (state.me) render(); });
window.addEventListener('sluice:unauthorized', () => {
  if (state.me && state.me.auth !== 'dev_auth') {
    clearToken();
    showLogin('Your credential was refused (revoked or unknown). Sign in again.');
  }
});
window.matchMedia('(prefers-color-scheme: dark)').addEventListener('change', applyTheme);
boot();
