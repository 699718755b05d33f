// The job page's uPlot charts: which series each shows, building and updating them (at most 4 redraws a second),
// zoom kept across live updates until a double click.

import { combined, sortSeries } from "./series.js";

const DRAW_EVERY_MS = 250;
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#bf3989", "#6e7781", "#4d2d00", "#0550ae"];
// The x range is set here, not by uPlot: for a single x value uPlot spans 1,000 days on a time axis (86400 / ms).
// A range narrower than MIN_SPAN (the first host samples, the first epoch) is widened around its middle.
const MIN_SPAN = { time: 60, step: 2, epoch: 1 };

// Each chart picks its series; `x` names the axis. Metric charts have one series per task.
const CHARTS = [
  {
    id: "loss",
    title: "Loss per task and overall (train)",
    x: "step",
    metric: (s) => s.phase === "train" && s.name === "loss",
    derived: { label: "overall (mean)", combine: "mean" },
  },
  {
    id: "examples",
    title: "Examples/s per task and total",
    x: "step",
    metric: (s) => s.phase === "train" && s.name === "examples_per_s",
    derived: { label: "total", combine: "sum" },
  },
  {
    // For loops that report no examples/s (a ParameterServer custom loop counted by the injected hook, a report()
    // call without it): their pace. A job with the Examples/s chart does not get this one too.
    id: "steps",
    title: "Steps/s per task and total",
    x: "step",
    metric: (s) => s.phase === "train" && s.name === "steps_per_s",
    unless: "examples",
    derived: { label: "total", combine: "sum" },
  },
  { id: "val_loss", title: "Validation loss per epoch", x: "epoch", metric: (s) => s.phase === "epoch_end" && s.name === "val_loss" },
  {
    id: "val_accuracy",
    title: "Validation accuracy per epoch",
    x: "epoch",
    metric: (s) => s.phase === "epoch_end" && /^val_.*acc/.test(s.name),
    named: (s, name) => (s.name === "val_accuracy" ? name : `${name} ${s.name}`),
  },
  { id: "cpu", title: "CPU % per host", x: "time", host: true, percent: true },
  { id: "mem", title: "Memory used per host (MiB)", x: "time", host: true },
  { id: "gpu_util", title: "GPU utilization %", x: "time", host: true, percent: true },
  { id: "gpu_mem", title: "GPU memory used (MiB)", x: "time", host: true },
];

export class Charts {
  /** `taskLabel(id)` names a task; `afterDraw()` runs after each redraw (stragglers are judged then). */
  constructor(container, store, taskLabel, afterDraw) {
    this.container = container;
    this.store = store;
    this.taskLabel = taskLabel;
    this.afterDraw = afterDraw;
    this.entries = new Map(); // id -> {def, figure, plot, keys, u, zoomed}
    this.dirty = new Set();
    this.scheduled = false;
    this.lastDraw = -Infinity; // the first draw waits for nothing (0 held it until 250 ms after navigation start)
    this.redraws = 0;
    this.firstDrawMs = null;
    new ResizeObserver(() => this.resize()).observe(container);
  }

  /** Take what the store changed, and draw soon. */
  schedule() {
    for (const change of this.store.changed.splice(0)) {
      if (change.chart) this.dirty.add(change.chart);
      else for (const def of CHARTS) if (def.metric && def.metric(change)) this.dirty.add(def.id);
      for (const def of CHARTS) if (def.unless && this.dirty.has(def.unless)) this.dirty.add(def.id);
    }
    if (this.scheduled || (!this.dirty.size && !this.store.stepTimesChanged)) return;
    this.scheduled = true;
    const wait = Math.max(0, DRAW_EVERY_MS - (performance.now() - this.lastDraw));
    setTimeout(() => requestAnimationFrame(() => this.draw()), wait);
  }

  draw() {
    this.scheduled = false;
    if (typeof uPlot === "undefined") {
      // uPlot (a deferred script) runs before DOMContentLoaded: draw then; if it never loaded, no charts.
      if (document.readyState === "loading") {
        this.scheduled = true;
        document.addEventListener("DOMContentLoaded", () => this.draw(), { once: true });
      }
      return;
    }
    if (this.firstDrawMs === null) performance.mark("tfdash:draw-start");
    this.lastDraw = performance.now();
    if (this.dirty.size) this.redraws += 1;
    // The page's first draw builds one chart and leaves the others to the next frame, so the first one shows
    // without waiting for every chart's build (bench/page_load.py).
    const firstOnly = this.firstDrawMs === null;
    for (const id of [...this.dirty]) {
      this.dirty.delete(id);
      const def = CHARTS.find((c) => c.id === id);
      const list = this.seriesFor(def);
      const entry = this.entries.get(id);
      if (!list.length) {
        if (entry && def.unless) this.remove(entry); // the chart it stands in for has appeared
        continue;
      }
      if (!entry || entry.keys !== this.keysOf(def, list)) {
        this.build(def, list);
      } else {
        entry.u.setData(this.tableFor(def, list), false);
        if (!entry.zoomed) fitX(entry);
      }
      if (firstOnly && this.dirty.size) {
        this.scheduled = true;
        requestAnimationFrame(() => this.draw());
        return;
      }
    }
    this.afterDraw();
  }

  remove(entry) {
    if (entry.u) entry.u.destroy();
    entry.figure.remove();
    this.entries.delete(entry.def.id);
  }

  seriesFor(def) {
    if (def.host) {
      return [...this.store.hosts.values()].filter((s) => s.chart === def.id).sort((a, b) => (a.label < b.label ? -1 : 1));
    }
    if (def.unless) {
      const other = CHARTS.find((c) => c.id === def.unless);
      for (const s of this.store.metrics.values()) if (other.metric(s)) return [];
    }
    return [...this.store.metrics.values()].filter(def.metric).sort((a, b) => a.task - b.task || (a.name < b.name ? -1 : 1));
  }

  labelOf(def, s) {
    if (def.host) return s.label;
    const name = this.taskLabel(s.task);
    return def.named ? def.named(s, name) : name;
  }

  build(def, list) {
    let entry = this.entries.get(def.id);
    if (!entry) {
      const figure = document.createElement("figure");
      figure.className = "chart";
      figure.dataset.chart = def.id;
      const caption = document.createElement("figcaption");
      caption.textContent = def.title;
      const plot = document.createElement("div");
      plot.className = "plot";
      figure.append(caption, plot);
      this.container.append(figure);
      entry = { def, figure, plot, keys: "", u: null, zoomed: false };
      this.entries.set(def.id, entry);
    }
    if (entry.u) entry.u.destroy();
    entry.zoomed = false;
    const derived = hasDerived(def, list)
      ? [{ label: def.derived.label, stroke: "#1f2328", width: 2.5, dash: [6, 3], spanGaps: true, points: { show: false } }]
      : [];
    const opts = {
      width: chartWidth(entry.plot),
      height: 220,
      scales: { x: { time: def.x === "time" }, y: def.percent ? { range: (u, min, max) => [0, Math.max(100, max)] } : {} },
      axes: [{ label: def.x === "time" ? "" : def.x }, { size: 60 }],
      series: [
        { label: def.x },
        ...list.map((s, i) => ({ label: this.labelOf(def, s), stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, points: { show: fewPoints } })),
        ...derived,
      ],
      cursor: { drag: { x: true, y: false } },
      hooks: {
        draw: [() => {
          if (this.firstDrawMs !== null) return;
          this.firstDrawMs = performance.now();
          performance.mark("tfdash:first-draw");
        }],
        setSelect: [(u) => { if (u.select.width > 0) entry.zoomed = true; }],
      },
    };
    entry.u = new uPlot(opts, this.tableFor(def, list), entry.plot);
    fitX(entry);
    // uPlot zooms on a drag and resets on a double click: live updates keep the zoom until then.
    entry.u.over.addEventListener("dblclick", () => {
      entry.zoomed = false;
      fitX(entry);
    });
    entry.keys = this.keysOf(def, list);
  }

  keysOf(def, list) {
    // Labels included: a chart drawn before its tasks had names is built again once they have.
    const keys = list.map((s) => (def.host ? s.label : `${s.task}|${s.name}|${this.labelOf(def, s)}`));
    return keys.join(",") + (hasDerived(def, list) ? "+" : "");
  }

  // Copies: uPlot keeps the arrays it is given, and ours grow between two draws.
  tableFor(def, list) {
    const tables = list.map((s) => {
      if (s.unsorted) sortSeries(s);
      return [s.xs.slice(), s.ys.slice()];
    });
    if (tables.length === 1) return tables[0];
    const table = uPlot.join(tables);
    if (hasDerived(def, list)) table.push(combined(table, def.derived.combine));
    return table;
  }

  resize() {
    for (const entry of this.entries.values()) {
      const width = chartWidth(entry.plot);
      if (entry.u && Math.abs(entry.u.width - width) > 1) entry.u.setSize({ width, height: 220 });
    }
  }

  /** Points drawn in chart `id` (its x values), or 0 before it exists. */
  points(id) {
    const entry = this.entries.get(id);
    return entry && entry.u ? entry.u.data[0].length : 0;
  }

  /** Labels of chart `id`'s series as drawn (x axis first), or [] before it exists. */
  series(id) {
    const entry = this.entries.get(id);
    return entry && entry.u ? entry.u.series.map((s) => s.label) : [];
  }

  /** Non-null values of chart `id`'s series number `index` (1 = the first task), as drawn. */
  values(id, index) {
    const entry = this.entries.get(id);
    const ys = entry && entry.u ? entry.u.data[index] || [] : [];
    return ys.filter((y) => y != null);
  }
}

function hasDerived(def, list) {
  return Boolean(def.derived) && list.length > 1;
}

function chartWidth(el) {
  return Math.max(200, Math.floor(el.clientWidth || 600));
}

// Dots where a series has few points in view (uPlot's own rule counts the x values of every series, so the first
// sample of each host, a few ms apart, would show no dot and, alone, no line either).
function fewPoints(u, si) {
  const [i0, i1] = u.series[0].idxs || [0, u.data[0].length - 1];
  const ys = u.data[si];
  let n = 0;
  for (let i = i0; i <= i1; i++) if (ys[i] != null) n += 1;
  return n * 8 <= u.width;
}

function fitX(entry) {
  const xs = entry.u.data[0];
  if (!xs.length) return;
  let min = xs[0];
  let max = xs[xs.length - 1];
  const span = MIN_SPAN[entry.def.x];
  if (max - min < span) {
    const mid = (min + max) / 2;
    min = mid - span / 2;
    max = mid + span / 2;
  }
  entry.u.setScale("x", { min, max });
}
