// Charts of the per-minute counters (GET /api/trends, GET /api/tenants/{t}/trends), drawn as
// inline SVG elements built here: no library, nothing fetched, no inline style (the CSP
// forbids it; colours come from classes in style.css). Each chart says its totals in its
// caption and carries them as data attributes (`data-total-<series>`), so a reader, and the
// browser test, can check it against the counts it came from.

import { h, num } from './dom.js';

const SVG = 'http://www.w3.org/2000/svg';
const W = 720;
const H = 160;
const PAD_LEFT = 44;
const PAD_BOTTOM = 18;

/** An SVG element with attributes and children. */
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** `HH:MM` of an RFC 3339 minute, in local time (axis labels). */
function hhmm(iso) {
  const d = new Date(iso);
  return `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`;
}

/** A short wait label: 150 ms, 2.5 s, >30 s. */
export function fmtWait(ms) {
  if (ms === null || ms === undefined) return '—';
  if (ms > 30000) return '>30 s';
  return ms >= 1000 ? `${ms / 1000} s` : `${ms} ms`;
}

/**
 * A line chart of per-minute series over `minutes` (RFC 3339 starts). `lines` are
 * `{name, label, values}`; a null value is a gap. `log` draws the y axis logarithmically
 * (waiting times, which are bucket bounds from 10 ms to 30 s). `caption` is text shown
 * above the chart; `totals` ({name: number}) become `data-total-<name>` attributes.
 */
export function lineChart({ id, title, minutes, lines, log = false, caption, totals = {} }) {
  const n = minutes.length;
  const all = lines.flatMap((l) => l.values.filter((v) => v !== null && v !== undefined));
  const max = Math.max(log ? 10 : 1, ...all);
  const lo = log ? Math.log10(10) : 0;
  const hi = log ? Math.log10(Math.max(max, 100)) : max;
  const x = (i) => PAD_LEFT + (n <= 1 ? 0 : (i * (W - PAD_LEFT - 4)) / (n - 1));
  const y = (v) => {
    const t = log ? (Math.log10(Math.max(v, 10)) - lo) / (hi - lo) : v / hi;
    return 4 + (1 - t) * (H - PAD_BOTTOM - 8);
  };
  const gap = (v) => v === null || v === undefined;
  const paths = lines.map((l) => {
    let d = '';
    const dots = [];
    l.values.forEach((v, i) => {
      if (gap(v)) return;
      const open = i > 0 && !gap(l.values[i - 1]);
      d += `${open ? 'L' : 'M'}${x(i).toFixed(1)} ${y(v).toFixed(1)} `;
      // A point with no neighbour draws no line: a dot shows it.
      if (!open && (i === l.values.length - 1 || gap(l.values[i + 1]))) {
        dots.push(s('circle', { class: `dot dot-${l.name}`, cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.5 }));
      }
    });
    return s('g', { 'data-series': l.name },
      s('path', { class: `line line-${l.name}`, d: d.trim() || 'M0 0' }, s('title', {}, l.label)), dots);
  });
  // Axes: the top and bottom values, and a time label every quarter of the window.
  const top = log ? fmtWait(Math.round(10 ** hi)) : num(max);
  const labels = [0, 0.25, 0.5, 0.75, 1].map((f) => {
    const i = Math.min(n - 1, Math.round(f * (n - 1)));
    return n ? s('text', { x: x(i), y: H - 4, class: 'axis', 'text-anchor': f === 0 ? 'start' : f === 1 ? 'end' : 'middle' }, hhmm(minutes[i])) : null;
  });
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': title },
    s('title', {}, title),
    s('line', { x1: PAD_LEFT, y1: H - PAD_BOTTOM - 4, x2: W, y2: H - PAD_BOTTOM - 4, class: 'grid' }),
    s('line', { x1: PAD_LEFT, y1: 4, x2: W, y2: 4, class: 'grid' }),
    s('text', { x: PAD_LEFT - 4, y: 12, class: 'axis', 'text-anchor': 'end' }, top),
    s('text', { x: PAD_LEFT - 4, y: H - PAD_BOTTOM - 4, class: 'axis', 'text-anchor': 'end' }, log ? '10 ms' : '0'),
    labels, paths);
  const dataset = {};
  for (const [k, v] of Object.entries(totals)) dataset[`total${k[0].toUpperCase()}${k.slice(1)}`] = String(v ?? '');
  const legend = h('span', { class: 'legend' }, lines.map((l) => h('span', { class: `key key-${l.name}` }, l.label)));
  return h('figure', { class: 'chart-box', id, dataset },
    h('figcaption', {}, h('strong', {}, title), ' ', legend, h('span', { class: 'muted chart-caption' }, caption || '')),
    svg);
}

/**
 * The charts of one trends series (`series` of the API's answer): starts, completions and
 * failures per minute, and waiting time p50/p99. `prefix` makes the element ids unique.
 */
export function trendCharts(series, prefix) {
  const t = series.totals;
  const counts = lineChart({
    id: `${prefix}-activity`,
    title: 'Per minute',
    minutes: series.minutes,
    lines: [
      { name: 'starts', label: 'starts', values: series.starts },
      { name: 'completions', label: 'completions', values: series.completions },
      { name: 'failures', label: 'failures', values: series.failures },
    ],
    caption: ` ${num(t.admissions)} admitted, ${num(t.starts)} started, ${num(t.completions)} completed, ` +
      `${num(t.failures)} failed, ${num(t.cancellations)} cancelled`,
    totals: t,
  });
  const waits = lineChart({
    id: `${prefix}-wait`,
    title: 'Waiting time',
    minutes: series.minutes,
    log: true,
    lines: [
      { name: 'p50', label: 'p50', values: series.wait_p50_ms },
      { name: 'p99', label: 'p99', values: series.wait_p99_ms },
    ],
    caption: ` whole window: p50 ${fmtWait(t.wait_p50_ms)}, p99 ${fmtWait(t.wait_p99_ms)} (upper bounds of histogram buckets)`,
    totals: { p50: t.wait_p50_ms, p99: t.wait_p99_ms },
  });
  return [counts, waits];
}
