// The page's series: metric points by "task|phase|name", host samples by "chart|host[|gpu]", each as parallel
// arrays; the derived series (mean/sum over tasks) and the straggler rule.
//
// Derived series: the loss chart adds "overall" (the mean over tasks at each step) and the throughput chart "total"
// (the sum). Tasks report on their own clocks (a train point every 0.5 s), so their steps rarely coincide: at a step,
// each task counts with its latest value at or before it, from its first point to its last (a task that stopped
// reporting, an earlier placement's, drops out).
//
// Stragglers: from the train metric `step_time_s`. A task's recent pace is the median of its last STRAGGLER_WINDOW
// points; it is flagged when that median is over STRAGGLER_RATIO x the median of the other tasks' recent points
// (pooled). The others', not everyone's: with two workers a median that includes the slow one could never be
// exceeded 1.5 times by it. A median over the window means the slowness *stays*, one slow step flags nothing.

const MAX_POINTS_PER_SERIES = 20000; // past this the older half of a series is thinned (every other point kept)
const MAX_HOST_SAMPLES = 3600; // per host series: an hour at one sample a second
const STRAGGLER_WINDOW = 20; // recent step_time_s points per task (a train point is a 0.5 s window: ~10 s)
const STRAGGLER_MIN_POINTS = 5; // fewer than this and a task's pace is not judged yet
const STRAGGLER_RATIO = 1.5;

export class SeriesStore {
  constructor() {
    this.metrics = new Map();
    this.hosts = new Map();
    this.cursor = 0; // the highest point number (the job's sequence) seen: a reconnect asks for what comes after it
    this.pointsReceived = 0;
    this.duplicatesReceived = 0;
    this.hostSamplesReceived = 0;
    this.changed = []; // series touched since the charts last looked: {phase, name} or {chart}
    this.stepTimesChanged = false;
  }

  /** A `metrics` frame's points, by the column names the frame announces; numbers at or below the cursor are dropped. */
  addPoints(frame) {
    const cols = frame.columns;
    const at = (name) => cols.indexOf(name);
    const [iId, iTask, iPhase, iName, iStep, iEpoch, iValue] = ["seq", "task", "phase", "name", "step", "epoch", "value"].map(at);
    for (const p of frame.points || []) {
      const id = p[iId];
      if (id <= this.cursor) {
        this.duplicatesReceived += 1;
        continue;
      }
      this.cursor = id;
      this.pointsReceived += 1;
      const key = `${p[iTask]}|${p[iPhase]}|${p[iName]}`;
      let series = this.metrics.get(key);
      if (!series) {
        series = { task: p[iTask], phase: p[iPhase], name: p[iName], ids: [], xs: [], ys: [], unsorted: false };
        this.metrics.set(key, series);
      }
      const byEpoch = series.phase === "epoch_end" && p[iEpoch] != null;
      appendPoint(series, id, byEpoch ? p[iEpoch] : p[iStep], p[iValue], MAX_POINTS_PER_SERIES);
      this.changed.push({ phase: series.phase, name: series.name });
      if (series.phase === "train" && series.name === "step_time_s") this.stepTimesChanged = true;
    }
    this.advance(frame.cursor);
  }

  advance(cursor) {
    if (typeof cursor === "number" && cursor > this.cursor) this.cursor = cursor;
  }

  /** A `hosts` frame: CPU, memory and per-GPU samples of the hosts that ran the job's tasks (on connect, every stored
   * one over the job's time; then live ones). One series per host (per host and GPU for the GPU charts). */
  addHostSamples(frame) {
    for (const s of frame.samples || []) {
      if (typeof s.ts !== "number" || typeof s.host !== "string") continue;
      this.hostSamplesReceived += 1;
      this.addHostValue("cpu", s.host, s.host, s.ts, s.cpu_percent);
      this.addHostValue("mem", s.host, s.host, s.ts, s.memory_used_mb);
      for (const gpu of Array.isArray(s.gpus) ? s.gpus : []) {
        const label = `${s.host} GPU ${gpu.index}`;
        this.addHostValue("gpu_util", `${s.host}|${gpu.index}`, label, s.ts, gpu.utilization_percent ?? gpu.utilization);
        this.addHostValue("gpu_mem", `${s.host}|${gpu.index}`, label, s.ts, gpu.memory_used_mb);
      }
    }
  }

  addHostValue(chart, seriesKey, label, ts, value) {
    if (typeof value !== "number" || !Number.isFinite(value)) return;
    const key = `${chart}|${seriesKey}`;
    let series = this.hosts.get(key);
    if (!series) {
      series = { chart, label, ids: [], xs: [], ys: [], unsorted: false };
      this.hosts.set(key, series);
    }
    const n = series.xs.length;
    if (n && ts <= series.xs[n - 1]) {
      // Older than the newest held: the same sample again (one per host and instant: a reconnect's history), or
      // one the page missed, which goes in its place.
      const at = lowerBound(series.xs, ts);
      if (series.xs[at] === ts) return;
      series.ids.splice(at, 0, null);
      series.xs.splice(at, 0, ts);
      series.ys.splice(at, 0, value);
    } else {
      appendPoint(series, null, ts, value, Infinity);
    }
    if (series.xs.length > MAX_HOST_SAMPLES) {
      for (const k of ["ids", "xs", "ys"]) series[k].splice(0, series[k].length - MAX_HOST_SAMPLES);
    }
    this.changed.push({ chart });
  }

  /** Stragglers among `current` task ids (null: every task): {paces: Map task -> ratio, flagged: [...]}. */
  stragglers(current) {
    const recent = new Map(); // task -> its last STRAGGLER_WINDOW step times
    for (const s of this.metrics.values()) {
      if (s.phase !== "train" || s.name !== "step_time_s") continue;
      if (current && !current.has(Number(s.task))) continue;
      if (s.unsorted) sortSeries(s);
      const values = s.ys.slice(-STRAGGLER_WINDOW).filter((v) => Number.isFinite(v) && v > 0);
      if (values.length >= STRAGGLER_MIN_POINTS) recent.set(Number(s.task), values);
    }
    const paces = new Map();
    const flagged = [];
    if (recent.size >= 2) {
      for (const [task, values] of recent) {
        const others = [];
        for (const [other, theirs] of recent) if (other !== task) others.push(...theirs);
        const mine = median(values);
        const reference = median(others);
        if (!reference) continue;
        const ratio = mine / reference;
        paces.set(task, ratio);
        if (ratio > STRAGGLER_RATIO) flagged.push({ task, median: mine, others: reference, ratio });
      }
    }
    return { paces, flagged };
  }
}

function appendPoint(series, id, x, y, cap) {
  const n = series.xs.length;
  if (n && x < series.xs[n - 1]) series.unsorted = true;
  series.ids.push(id);
  series.xs.push(x);
  series.ys.push(y);
  if (series.xs.length > cap) thin(series);
}

/** The first index of sorted `xs` whose value is not below `x`. */
function lowerBound(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

function thin(series) {
  const half = series.xs.length >> 1;
  for (const key of ["ids", "xs", "ys"]) {
    const old = series[key];
    const kept = [];
    for (let i = 0; i < half; i += 2) kept.push(old[i]);
    series[key] = kept.concat(old.slice(half));
  }
}

export function sortSeries(series) {
  const order = series.xs.map((_, i) => i).sort((a, b) => series.xs[a] - series.xs[b]);
  for (const key of ["ids", "xs", "ys"]) {
    const old = series[key];
    series[key] = order.map((i) => old[i]);
  }
  series.unsorted = false;
}

function median(values) {
  if (!values.length) return null;
  const sorted = values.slice().sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** The mean or sum over the task columns of a joined table, each task with its latest value at or before the row,
 * between its own first and last point (see the top of this file). */
export function combined(table, how) {
  const rows = table[0].length;
  const columns = table.slice(1);
  const spans = columns.map((ys) => {
    let first = -1;
    let last = -1;
    for (let i = 0; i < rows; i++) {
      if (ys[i] != null) {
        if (first < 0) first = i;
        last = i;
      }
    }
    return [first, last];
  });
  const held = new Array(columns.length).fill(null);
  const out = new Array(rows);
  for (let i = 0; i < rows; i++) {
    let total = 0;
    let count = 0;
    for (let j = 0; j < columns.length; j++) {
      const y = columns[j][i];
      if (y != null) held[j] = y;
      if (i >= spans[j][0] && i <= spans[j][1] && held[j] != null) {
        total += held[j];
        count += 1;
      }
    }
    out[i] = count ? (how === "sum" ? total : total / count) : null;
  }
  return out;
}
