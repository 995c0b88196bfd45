// Talking to sluice's API on the same origin. The credential (a platform admin token or an
// `sk_...` key) is kept in sessionStorage only: it lives as long as the tab and is never
// written anywhere else. A 401 clears it and sends the user back to the login page.

const TOKEN_KEY = 'sluice.token';

export function token() { return sessionStorage.getItem(TOKEN_KEY); }
export function setToken(t) { sessionStorage.setItem(TOKEN_KEY, t); }
export function clearToken() { sessionStorage.removeItem(TOKEN_KEY); }

/** An answer that was not 2xx, with its problem document when there was one. */
export class ApiError extends Error {
  constructor(status, problem, headers) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
    this.code = this.problem.code || `http_${status}`;
    this.headers = headers;
  }
}

function headersFor(tenant, extra) {
  const headers = new Headers(extra || {});
  const t = token();
  if (t) headers.set('Authorization', `Bearer ${t}`);
  if (tenant) headers.set('X-Tenant-Id', tenant);
  return headers;
}

/**
 * One API call. Resolves `{status, data, headers}` for 2xx (data is null for 204); rejects
 * with an ApiError otherwise. A 401 also tells the app (event `sluice:unauthorized`).
 */
export async function call(method, path, { body, tenant, signal } = {}) {
  const headers = headersFor(tenant, body !== undefined ? { 'Content-Type': 'application/json' } : {});
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body !== undefined ? JSON.stringify(body) : undefined,
      signal,
      cache: 'no-store',
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, { code: 'network_error', detail: `the server did not answer (${e.message})` });
  }
  const type = res.headers.get('Content-Type') || '';
  const data = res.status === 204 ? null
    : (type.includes('json') ? await res.json().catch(() => null) : null);
  if (res.ok) return { status: res.status, data, headers: res.headers };
  if (res.status === 401) window.dispatchEvent(new CustomEvent('sluice:unauthorized'));
  throw new ApiError(res.status, data, res.headers);
}

/** Query string of the defined, non-empty values. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
export const isTerminal = (status) => TERMINAL.has(status);

/**
 * Follows one execution through `GET /api/executions/{id}/events` (Server-Sent Events read
 * with fetch, which sends the Authorization header, unlike EventSource). Calls
 * `onExecution(execution)` for each state and `onDeleted()` once if it is force-deleted.
 * A stream that ends before a terminal state is opened again (its first event is the state
 * then, so nothing is lost), at most `maxStreams` times. Resolves when done; abort with
 * `signal`.
 */
export async function followExecution(tenant, id, { onExecution, onDeleted, onError, signal, maxStreams = 50 }) {
  for (let round = 0; round < maxStreams && !signal.aborted; round++) {
    let res;
    try {
      res = await fetch(`/api/executions/${encodeURIComponent(id)}/events`, {
        headers: headersFor(tenant, { Accept: 'text/event-stream' }),
        signal,
        cache: 'no-store',
      });
    } catch (e) {
      if (e.name === 'AbortError') return;
      await pause(1000 * Math.min(round + 1, 5), signal);
      continue;
    }
    if (!res.ok) {
      if (res.status === 401) window.dispatchEvent(new CustomEvent('sluice:unauthorized'));
      const problem = await res.json().catch(() => null);
      const err = new ApiError(res.status, problem, res.headers);
      if (res.status === 404) { onDeleted && onDeleted(); return; }
      onError && onError(err);
      if (res.status === 429 || res.status === 503) {
        await pause(1000 * Number(res.headers.get('Retry-After') || 2), signal);
        continue;
      }
      return;
    }
    let done = false;
    try {
      done = await readEvents(res.body, (name, data) => {
        if (name === 'deleted') { onDeleted && onDeleted(); return true; }
        if (name === 'execution') {
          const e = JSON.parse(data);
          onExecution(e);
          return isTerminal(e.status);
        }
        return false;
      });
    } catch (e) {
      if (e.name === 'AbortError') return;
    }
    if (done) return;
  }
}

/** Reads an event stream; `onEvent(name, data)` returns true to stop. Resolves true if stopped. */
async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let name = 'message';
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      buffer += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl).replace(/\r$/, '');
        buffer = buffer.slice(nl + 1);
        if (line === '') {
          if (data.length && onEvent(name, data.join('\n'))) return true;
          name = 'message';
          data = [];
        } else if (line.startsWith(':')) {
          // a heartbeat
        } else {
          const colon = line.indexOf(':');
          const fieldName = colon < 0 ? line : line.slice(0, colon);
          const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (fieldName === 'event') name = val;
          else if (fieldName === 'data') data.push(val);
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });
}
