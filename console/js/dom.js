// DOM helpers. Everything the console shows is built here as elements and text nodes: a
// string given as a child always becomes a text node (never markup), so params, outputs,
// errors and flow ids from the API can only ever be rendered as text. The server's
// Content-Security-Policy also requires Trusted Types, so assigning an HTML string to an
// element would throw rather than parse.

/** Builds an element: `h('a', {href: '#/x', class: 'btn'}, 'text', child, [more])`. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'value' || name === 'checked' || name === 'selected' || name === 'disabled') {
      el[name] = value;
    } else if (name === 'dataset') {
      Object.assign(el.dataset, value);
    } else {
      el.setAttribute(name, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Appends children: strings and numbers as text, nodes as they are, arrays flattened. */
export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replaces an element's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A `<pre>` showing any JSON value as indented text. */
export function jsonBlock(value, attrs) {
  const text = value === undefined ? '' : JSON.stringify(value, null, 2);
  return h('pre', Object.assign({ class: 'json' }, attrs || {}), text);
}

const settings = {
  get timeMode() { return localStorage.getItem('sluice.time') === 'utc' ? 'utc' : 'local'; },
  set timeMode(v) { localStorage.setItem('sluice.time', v); },
  get theme() { return localStorage.getItem('sluice.theme') || 'system'; },
  set theme(v) { localStorage.setItem('sluice.theme', v); },
};
export { settings };

const pad = (n, w = 2) => String(n).padStart(w, '0');

/** An RFC 3339 time as the user chose to read times: local or UTC. */
export function fmtTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  if (settings.timeMode === 'utc') {
    return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
      `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}.` +
      `${pad(d.getUTCMilliseconds(), 3)} UTC`;
  }
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.` +
    `${pad(d.getMilliseconds(), 3)}`;
}

/** The value of a `datetime-local` input for an RFC 3339 time, in the chosen time mode. */
export function toInputTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  if (settings.timeMode === 'utc') {
    return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}T` +
      `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`;
  }
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** An RFC 3339 time (UTC) from a `datetime-local` input read in the chosen time mode. */
export function fromInputTime(value) {
  if (!value) return '';
  const full = value.length === 16 ? `${value}:00` : value;
  const d = settings.timeMode === 'utc' ? new Date(`${full}Z`) : new Date(full);
  return Number.isNaN(d.getTime()) ? '' : d.toISOString();
}

/** A status badge. */
export function statusBadge(status, extra) {
  return h('span', { class: `badge st-${status}`, dataset: { status } }, status, extra ? ` · ${extra}` : null);
}

let toastBox;
/** A short message in the corner; errors stay until clicked. */
export function toast(message, kind = 'info') {
  if (!toastBox) {
    toastBox = h('div', { class: 'toasts', role: 'status', 'aria-live': 'polite' });
    document.body.append(toastBox);
  }
  const t = h('div', { class: `toast ${kind}`, onclick: () => t.remove() }, message);
  toastBox.append(t);
  if (kind !== 'error') setTimeout(() => t.remove(), 5000);
  return t;
}

/**
 * Asks for confirmation in a modal; with `typed`, the user must type that text first.
 * Resolves true when confirmed.
 */
export function confirmDialog({ title, message, typed, action = 'Confirm', danger = false }) {
  return new Promise((resolve) => {
    const input = typed ? h('input', { id: 'confirm-input', autocomplete: 'off', spellcheck: 'false' }) : null;
    const ok = h('button', { id: 'confirm-ok', type: 'submit', class: danger ? 'danger' : 'primary', disabled: !!typed }, action);
    const cancel = h('button', { id: 'confirm-cancel', type: 'button' }, 'Cancel');
    const form = h('form', { method: 'dialog', class: 'dialog-form' },
      h('h2', {}, title),
      h('p', {}, message),
      typed ? h('label', { for: 'confirm-input' }, 'Type ', h('code', {}, typed), ' to confirm') : null,
      input,
      h('div', { class: 'row-actions' }, cancel, ok));
    const dialog = h('dialog', { class: 'confirm' }, form);
    let answered = false;
    const finish = (value) => {
      if (answered) return;
      answered = true;
      dialog.close();
      dialog.remove();
      resolve(value);
    };
    if (input) input.addEventListener('input', () => { ok.disabled = input.value !== typed; });
    cancel.addEventListener('click', () => finish(false));
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      finish(!typed || input.value === typed);
    });
    dialog.addEventListener('cancel', () => finish(false));
    document.body.append(dialog);
    dialog.showModal();
    (input || ok).focus();
  });
}

/** A labelled form field. */
export function field(label, control, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label), control,
    hint ? h('span', { class: 'hint' }, hint) : null);
}

/** Number formatting with thousands separators. */
export function num(n) {
  return typeof n === 'number' ? n.toLocaleString('en-US') : String(n ?? '—');
}

/** Bytes in the largest binary unit that keeps a whole part: `1.5 GiB`, `640 KiB`, `12 B`. */
export function fmtBytes(n) {
  if (typeof n !== 'number') return String(n ?? '—');
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${num(n)} B` : `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}
