// The job page's live client: one WebSocket per page, history first, then live frames, drawn with uPlot.
//
// No gap, no duplicate: point ids grow in commit order, so the page keeps `cursor`, the highest id it has seen, and
// after a lost connection asks for `?since=<cursor>`: the server sends exactly the points after it. A point at or
// below the cursor is a duplicate; it is counted and dropped. Redraws are batched (at most 4 a second).
//
// Refusals: the server closes with 4403 when the user may not see the job, but a refusal before the handshake reaches
// a browser only as a failed connection (code 1006), the same as a server that is down. So after a connection that
// never opened, the page asks for its own live partial: 403/404 or a redirect to the login page means "not allowed"
// (and no more tries); a network error or any other answer means the server is away, so it tries again.
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
// Shown live in the task table's Pace column and in a line above the charts; only tasks of the current placement
// (the table's rows) take part.
//
// State for tests and curious people: window.tfdashLive (read-only). `firstDrawMs` is the time, from navigation
// start (performance.now()), at which the first chart finished drawing.
(() => {
  "use strict";

  // The log tail panel (htmx swaps it in every 2 s): keep the newest line in view.
  function tailToEnd() {
    const pre = document.getElementById("log-tail-text");
    if (pre) pre.scrollTop = pre.scrollHeight;
  }
  document.addEventListener("htmx:afterSettle", tailToEnd);
  tailToEnd();

  const root = document.getElementById("live-metrics");
  if (!root || typeof uPlot === "undefined") return;

  const RETRY_FIRST_MS = 500;
  const RETRY_MAX_MS = 5000;
  const DRAW_EVERY_MS = 250;
  const MAX_POINTS_PER_SERIES = 20000; // past this the older half of a series is thinned (every other point kept)
  const MAX_HOST_SAMPLES = 3600; // per host series: an hour at one sample a second
  const STRAGGLER_WINDOW = 20; // recent step_time_s points per task (a train point is a 0.5 s window: ~10 s)
  const STRAGGLER_MIN_POINTS = 5; // fewer than this and a task's pace is not judged yet
  const STRAGGLER_RATIO = 1.5;
  const DEFAULT_COLUMNS = ["id", "task", "phase", "name", "step", "epoch", "value", "ts"];
  const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#bf3989", "#6e7781", "#4d2d00", "#0550ae"];

  const statusEl = document.getElementById("live-status");
  const emptyEl = document.getElementById("live-empty");
  const downsampledEl = document.getElementById("live-downsampled");
  const chartsEl = document.getElementById("charts");
  const factsEl = document.getElementById("task-facts");
  const stragglersEl = document.getElementById("stragglers");
  const namesEl = document.getElementById("task-names");
  const taskNames = namesEl ? JSON.parse(namesEl.textContent) : {};

  const state = {
    status: "connecting",
    cursor: 0,
    pointsReceived: 0,
    duplicatesReceived: 0,
    hostSamplesReceived: 0,
    framesReceived: 0,
    reconnects: 0,
    connectAttempts: 0,
    redraws: 0,
    downsampled: false,
    firstDrawMs: null,
    stragglers: [], // [{task, median, others, ratio}]
    paces: new Map(), // task id -> ratio of its recent median step time to the others'
  };
  let stepTimesChanged = false;
  let socket = null;
  let everOpened = false;
  let retryDelay = RETRY_FIRST_MS;
  let retryTimer = null;
  let stopped = false;

  // --- data ------------------------------------------------------------------------------------------------------
  // Metric series by "task|phase|name"; host series by "chart|host[|gpu]". Each holds parallel arrays.
  const metricSeries = new Map();
  const hostSeries = new Map();

  // Names come with the page; a task placed after it loaded is named by its row in the (live) task table.
  function taskLabel(task) {
    if (!taskNames[task]) {
      const row = document.querySelector(`tr[data-task-id="${Number(task)}"]`);
      if (row && row.dataset.taskLabel) taskNames[task] = row.dataset.taskLabel;
    }
    return taskNames[task] || `task ${task}`;
  }

  function appendPoint(series, id, x, y) {
    const n = series.xs.length;
    if (n && x < series.xs[n - 1]) series.unsorted = true;
    series.ids.push(id);
    series.xs.push(x);
    series.ys.push(y);
    if (series.xs.length > MAX_POINTS_PER_SERIES) thin(series);
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

  function sortSeries(series) {
    const order = series.xs.map((_, i) => i).sort((a, b) => series.xs[a] - series.xs[b]);
    for (const key of ["ids", "xs", "ys"]) {
      const old = series[key];
      series[key] = order.map((i) => old[i]);
    }
    series.unsorted = false;
  }

  function onPoints(frame) {
    const cols = Array.isArray(frame.columns) ? frame.columns : DEFAULT_COLUMNS;
    const at = Object.fromEntries(DEFAULT_COLUMNS.map((name) => [name, cols.indexOf(name)]));
    for (const p of frame.points || []) {
      const id = p[at.id];
      if (id <= state.cursor) {
        state.duplicatesReceived += 1;
        continue;
      }
      state.cursor = id;
      state.pointsReceived += 1;
      const key = `${p[at.task]}|${p[at.phase]}|${p[at.name]}`;
      let series = metricSeries.get(key);
      if (!series) {
        series = { task: p[at.task], phase: p[at.phase], name: p[at.name], ids: [], xs: [], ys: [], unsorted: false };
        metricSeries.set(key, series);
      }
      const byEpoch = series.phase === "epoch_end" && p[at.epoch] != null;
      appendPoint(series, id, byEpoch ? p[at.epoch] : p[at.step], p[at.value]);
      markDirty(series.phase, series.name);
      if (series.phase === "train" && series.name === "step_time_s") stepTimesChanged = true;
    }
    if (typeof frame.cursor === "number" && frame.cursor > state.cursor) state.cursor = frame.cursor;
  }

  function onHosts(frame) {
    for (const s of frame.samples || []) {
      if (typeof s.ts !== "number" || typeof s.host !== "string") continue;
      state.hostSamplesReceived += 1;
      addHostValue("cpu", s.host, s.host, s.ts, s.cpu_percent);
      addHostValue("mem", s.host, s.host, s.ts, s.memory_used_mb);
      for (const gpu of Array.isArray(s.gpus) ? s.gpus : []) {
        const label = `${s.host} GPU ${gpu.index}`;
        addHostValue("gpu_util", `${s.host}|${gpu.index}`, label, s.ts, gpu.utilization_percent ?? gpu.utilization);
        addHostValue("gpu_mem", `${s.host}|${gpu.index}`, label, s.ts, gpu.memory_used_mb);
      }
    }
  }

  function addHostValue(chartId, seriesKey, label, ts, value) {
    if (typeof value !== "number" || !Number.isFinite(value)) return;
    const key = `${chartId}|${seriesKey}`;
    let series = hostSeries.get(key);
    if (!series) {
      series = { chart: chartId, label, ids: [], xs: [], ys: [], unsorted: false };
      hostSeries.set(key, series);
    }
    const n = series.xs.length;
    if (n && ts <= series.xs[n - 1]) return; // the same sample again (one per host and instant)
    appendPoint(series, null, ts, value);
    if (series.xs.length > MAX_HOST_SAMPLES) {
      for (const k of ["ids", "xs", "ys"]) series[k].splice(0, series[k].length - MAX_HOST_SAMPLES);
    }
    dirty.add(chartId);
  }

  function onFacts(frame) {
    if (!factsEl || !frame.facts || typeof frame.facts !== "object") return;
    const list = factsEl.querySelector("div");
    const id = `task-facts-${Number(frame.task)}`;
    let block = document.getElementById(id);
    if (!block) {
      block = document.createElement("div");
      block.id = id;
      block.className = "task-facts";
      const title = document.createElement("h3");
      title.textContent = taskLabel(frame.task);
      block.append(title, document.createElement("dl"));
      list.append(block);
    }
    const dl = block.querySelector("dl");
    dl.replaceChildren();
    for (const [key, value] of Object.entries(frame.facts)) {
      const dt = document.createElement("dt");
      dt.textContent = key;
      const dd = document.createElement("dd");
      dd.textContent = value !== null && typeof value === "object" ? JSON.stringify(value) : String(value);
      dl.append(dt, dd);
    }
    factsEl.hidden = false;
  }

  // --- charts ----------------------------------------------------------------------------------------------------
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
      id: "val_loss",
      title: "Validation loss per epoch",
      x: "epoch",
      metric: (s) => s.phase === "epoch_end" && s.name === "val_loss",
    },
    {
      id: "val_accuracy",
      title: "Validation accuracy per epoch",
      x: "epoch",
      metric: (s) => s.phase === "epoch_end" && /^val_.*acc/.test(s.name),
      label: (s) => (s.name === "val_accuracy" ? taskLabel(s.task) : `${taskLabel(s.task)} ${s.name}`),
    },
    { id: "cpu", title: "CPU % per host", x: "time", host: true, percent: true },
    { id: "mem", title: "Memory used per host (MiB)", x: "time", host: true },
    { id: "gpu_util", title: "GPU utilization %", x: "time", host: true, percent: true },
    { id: "gpu_mem", title: "GPU memory used (MiB)", x: "time", host: true },
  ];
  const charts = new Map(); // id -> {def, figure, plot, keys, zoomed}
  const dirty = new Set();
  let drawScheduled = false;
  let lastDraw = 0;

  function markDirty(phase, name) {
    const s = { phase, name };
    for (const def of CHARTS) if (def.metric && def.metric(s)) dirty.add(def.id);
  }

  function seriesFor(def) {
    if (def.host) {
      return [...hostSeries.values()].filter((s) => s.chart === def.id).sort((a, b) => (a.label < b.label ? -1 : 1));
    }
    return [...metricSeries.values()].filter(def.metric).sort((a, b) => a.task - b.task || (a.name < b.name ? -1 : 1));
  }

  function chartWidth(el) {
    return Math.max(200, Math.floor(el.clientWidth || 600));
  }

  function build(def, list) {
    let entry = charts.get(def.id);
    if (!entry) {
      const figure = document.createElement("figure");
      figure.className = "chart";
      figure.dataset.chart = def.id;
      const caption = document.createElement("figcaption");
      caption.textContent = def.title;
      const plot = document.createElement("div");
      plot.className = "plot";
      figure.append(caption, plot);
      chartsEl.append(figure);
      entry = { def, figure, plot, keys: "", u: null, zoomed: false };
      charts.set(def.id, entry);
    }
    if (entry.u) entry.u.destroy();
    entry.zoomed = false;
    const label = def.label || ((s) => (def.host ? s.label : taskLabel(s.task)));
    const derived = hasDerived(def, list)
      ? [{ label: def.derived.label, stroke: "#1f2328", width: 2.5, dash: [6, 3], spanGaps: true, points: { show: false } }]
      : [];
    const opts = {
      width: chartWidth(entry.plot),
      height: 220,
      scales: {
        x: { time: def.x === "time" },
        y: def.percent ? { range: (u, min, max) => [0, Math.max(100, max)] } : {},
      },
      axes: [{ label: def.x === "time" ? "" : def.x }, { size: 60 }],
      series: [
        { label: def.x },
        ...list.map((s, i) => ({
          label: label(s),
          stroke: COLORS[i % COLORS.length],
          width: 1.5,
          spanGaps: true,
          points: { show: fewPoints },
        })),
        ...derived,
      ],
      cursor: { drag: { x: true, y: false } },
      hooks: {
        draw: [
          () => {
            if (state.firstDrawMs === null) state.firstDrawMs = performance.now();
          },
        ],
        setSelect: [
          (u) => {
            if (u.select.width > 0) entry.zoomed = true;
          },
        ],
      },
    };
    entry.u = new uPlot(opts, tableFor(def, list), entry.plot);
    fitX(entry);
    // uPlot zooms on a drag and resets on a double click: live updates keep the zoom until then.
    entry.u.over.addEventListener("dblclick", () => {
      entry.zoomed = false;
      fitX(entry);
    });
    entry.keys = seriesKeys(def, list);
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

  function seriesKeys(def, list) {
    // Labels included: a chart drawn before its tasks had names is built again once they have.
    const keys = list.map((s) => (def.host ? s.label : `${s.task}|${s.name}|${taskLabel(s.task)}`));
    return keys.join(",") + (hasDerived(def, list) ? "+" : "");
  }

  function hasDerived(def, list) {
    return Boolean(def.derived) && list.length > 1;
  }

  // The x range is set here, not by uPlot: for a single x value uPlot spans 1,000 days on a time axis (86400 / ms).
  // A range narrower than MIN_SPAN (the first host samples, the first epoch) is widened around its middle.
  const MIN_SPAN = { time: 60, step: 2, epoch: 1 };

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

  // Copies: uPlot keeps the arrays it is given, and ours grow between two draws.
  function tableFor(def, list) {
    const tables = list.map((s) => {
      if (s.unsorted) sortSeries(s);
      return [s.xs.slice(), s.ys.slice()];
    });
    if (tables.length === 1) return tables[0];
    const table = uPlot.join(tables);
    if (hasDerived(def, list)) table.push(combined(table, def.derived.combine));
    return table;
  }

  // The mean or sum over the task columns of a joined table, each task with its latest value at or before the row,
  // between its own first and last point (see the top of this file).
  function combined(table, how) {
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

  // --- stragglers ------------------------------------------------------------------------------------------------
  function median(values) {
    if (!values.length) return null;
    const sorted = values.slice().sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  }

  function currentTaskIds() {
    const rows = document.querySelectorAll("tr[data-task-id]");
    return rows.length ? new Set([...rows].map((r) => Number(r.dataset.taskId))) : null;
  }

  function findStragglers() {
    const current = currentTaskIds();
    const recent = new Map(); // task -> its last STRAGGLER_WINDOW step times
    for (const s of metricSeries.values()) {
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
    state.paces = paces;
    state.stragglers = flagged;
    showStragglers();
  }

  function showStragglers() {
    const flagged = new Set(state.stragglers.map((s) => s.task));
    for (const row of document.querySelectorAll("tr[data-task-id]")) {
      const task = Number(row.dataset.taskId);
      const cell = row.querySelector("td.pace");
      const ratio = state.paces.get(task);
      row.classList.toggle("straggler", flagged.has(task));
      if (!cell) continue;
      if (ratio === undefined) {
        cell.textContent = "—";
      } else {
        cell.textContent = flagged.has(task) ? `straggler · ${ratio.toFixed(1)}×` : `${ratio.toFixed(2)}×`;
        cell.title = "median of its recent step times against the other tasks'";
      }
    }
    if (!stragglersEl) return;
    stragglersEl.hidden = flagged.size === 0;
    stragglersEl.textContent = state.stragglers
      .map(
        (s) =>
          `Straggler: ${taskLabel(s.task)}: recent step time ${s.median.toFixed(3)} s, ` +
          `${s.ratio.toFixed(1)}× the other tasks' ${s.others.toFixed(3)} s.`,
      )
      .join(" ");
  }

  // The task table is swapped in by htmx every 2 s: put the flags back on the fresh rows.
  document.addEventListener("htmx:afterSwap", (event) => {
    if (event.target && event.target.id === "job-live") showStragglers();
  });

  function draw() {
    drawScheduled = false;
    lastDraw = performance.now();
    if (stepTimesChanged) {
      stepTimesChanged = false;
      findStragglers();
    }
    if (!dirty.size) return;
    state.redraws += 1;
    for (const id of dirty) {
      const def = CHARTS.find((c) => c.id === id);
      const list = seriesFor(def);
      if (!list.length) continue;
      const entry = charts.get(id);
      if (!entry || entry.keys !== seriesKeys(def, list)) {
        build(def, list);
      } else {
        entry.u.setData(tableFor(def, list), false);
        if (!entry.zoomed) fitX(entry);
      }
    }
    dirty.clear();
    if (emptyEl) emptyEl.hidden = charts.size > 0;
  }

  function scheduleDraw() {
    if (drawScheduled || (!dirty.size && !stepTimesChanged)) return;
    drawScheduled = true;
    const wait = Math.max(0, DRAW_EVERY_MS - (performance.now() - lastDraw));
    setTimeout(() => requestAnimationFrame(draw), wait);
  }

  const resizer = new ResizeObserver(() => {
    for (const entry of charts.values()) {
      const width = chartWidth(entry.plot);
      if (entry.u && Math.abs(entry.u.width - width) > 1) entry.u.setSize({ width, height: 220 });
    }
  });
  resizer.observe(chartsEl);

  // --- the socket ------------------------------------------------------------------------------------------------
  const STATUS_TEXT = { connecting: "connecting…", loading: "loading…", live: "live", reconnecting: "reconnecting…" };

  function setStatus(status) {
    state.status = status;
    statusEl.textContent = STATUS_TEXT[status] || status;
    statusEl.dataset.status = status;
  }

  function connect() {
    retryTimer = null;
    if (stopped) return;
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${location.host}${root.dataset.wsPath}?since=${state.cursor}`;
    state.connectAttempts += 1;
    const ws = new WebSocket(url);
    socket = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      if (everOpened) state.reconnects += 1;
      everOpened = true;
      setStatus("loading");
    };
    ws.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return; // not ours to show
      }
      state.framesReceived += 1;
      handle(frame);
    };
    ws.onclose = (event) => {
      if (socket !== ws) return;
      socket = null;
      if (stopped) return;
      if (event.code === 4403) {
        notAllowed();
      } else if (!opened) {
        probeThenRetry();
      } else {
        retryLater();
      }
    };
  }

  function handle(frame) {
    switch (frame.type) {
      case "metrics":
        onPoints(frame);
        if (frame.downsampled) state.downsampled = true;
        break;
      case "history_end":
        if (typeof frame.cursor === "number" && frame.cursor > state.cursor) state.cursor = frame.cursor;
        if (frame.downsampled) state.downsampled = true;
        if (downsampledEl) downsampledEl.hidden = !state.downsampled;
        retryDelay = RETRY_FIRST_MS; // a connection that delivered its history counts as a good one
        setStatus("live");
        break;
      case "hosts":
        onHosts(frame);
        break;
      case "facts":
        onFacts(frame);
        break;
      default:
        return; // job and task states: the htmx partial shows them
    }
    scheduleDraw();
  }

  function retryLater() {
    setStatus("reconnecting");
    const jitter = 0.8 + Math.random() * 0.4;
    retryTimer = setTimeout(connect, Math.round(retryDelay * jitter));
    retryDelay = Math.min(retryDelay * 2, RETRY_MAX_MS);
  }

  async function probeThenRetry() {
    setStatus("reconnecting");
    let answer = null;
    try {
      answer = await fetch(root.dataset.probeUrl, { redirect: "manual", cache: "no-store", credentials: "same-origin" });
    } catch {
      answer = null; // the server is away: try again later
    }
    if (stopped) return;
    if (answer && (answer.type === "opaqueredirect" || answer.status === 403 || answer.status === 404)) {
      notAllowed();
    } else {
      retryLater();
    }
  }

  function notAllowed() {
    stopped = true;
    if (retryTimer) clearTimeout(retryTimer);
    retryTimer = null;
    setStatus("not allowed");
  }

  window.addEventListener("online", () => {
    if (retryTimer) {
      clearTimeout(retryTimer);
      connect();
    }
  });
  window.addEventListener("pagehide", () => {
    stopped = true;
    if (retryTimer) clearTimeout(retryTimer);
    retryTimer = null;
    if (socket) socket.close(1000);
  });
  window.addEventListener("pageshow", (event) => {
    if (event.persisted && state.status !== "not allowed") {
      stopped = false; // back from the back/forward cache: pick up where the page left off
      connect();
    }
  });

  window.tfdashLive = Object.freeze({
    get status() {
      return state.status;
    },
    get cursor() {
      return state.cursor;
    },
    get pointsReceived() {
      return state.pointsReceived;
    },
    get duplicatesReceived() {
      return state.duplicatesReceived;
    },
    get hostSamplesReceived() {
      return state.hostSamplesReceived;
    },
    get framesReceived() {
      return state.framesReceived;
    },
    get reconnects() {
      return state.reconnects;
    },
    get connectAttempts() {
      return state.connectAttempts;
    },
    get retryScheduled() {
      return retryTimer !== null;
    },
    get redraws() {
      return state.redraws;
    },
    get downsampled() {
      return state.downsampled;
    },
    /** Milliseconds from navigation start to the end of the first chart's first draw; null before. */
    get firstDrawMs() {
      return state.firstDrawMs;
    },
    /** Tasks flagged as stragglers now: [{task, median, others, ratio}]. */
    get stragglers() {
      return state.stragglers.map((s) => ({ ...s }));
    },
    /** Points held for metric `name` over every task and phase. */
    seriesPointCount(name) {
      let count = 0;
      for (const s of metricSeries.values()) if (s.name === name) count += s.xs.length;
      return count;
    },
    /** Ids of every metric point held (all of them unless a series passed MAX_POINTS_PER_SERIES), ascending. */
    pointIds() {
      const ids = [];
      for (const s of metricSeries.values()) ids.push(...s.ids);
      return ids.sort((a, b) => a - b);
    },
    /** Points drawn in chart `id` (its x values), or 0 before it exists. */
    chartPoints(id) {
      const entry = charts.get(id);
      return entry && entry.u ? entry.u.data[0].length : 0;
    },
    /** Labels of chart `id`'s series as drawn (x axis first), or [] before it exists. */
    chartSeries(id) {
      const entry = charts.get(id);
      return entry && entry.u ? entry.u.series.map((s) => s.label) : [];
    },
    /** Non-null values of chart `id`'s series number `index` (1 = the first task), as drawn. */
    chartValues(id, index) {
      const entry = charts.get(id);
      const ys = entry && entry.u ? entry.u.data[index] || [] : [];
      return ys.filter((y) => y != null);
    },
  });

  connect();
})();
