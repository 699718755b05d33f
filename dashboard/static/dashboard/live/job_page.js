// The job page's live client: one WebSocket carries the job's state and task table (`job`, `task`), its log tail
// (`log`), and its charts (`metrics` history then live, `hosts`, `facts`). No polling: nothing on this page asks the
// server again by itself.
//
// No gap, no duplicate: a job's points are numbered in commit order (its sequence, whichever ingest partition stored
// them), so the page keeps `cursor`, the highest number it has seen, and
// after a lost connection asks for `?since=<cursor>`: the server sends exactly the points after it. A point at or
// below the cursor is counted and dropped. Log lines have a cursor per task (each `log` frame says it; the page
// starts from the one it was served with) and a reconnect passes them as `log_since`; a line is kept once by its
// seq all the same. Job and task frames carry the whole current state.
//
// State for tests and curious people: window.tfdashLive (read-only). `firstDrawMs` is the time, from navigation
// start (performance.now()), at which the first chart finished drawing.

import { Charts } from "./charts.js";
import { LogTail } from "./log_tail.js";
import { replaceWithMarkup } from "./markup.js";
import { SeriesStore } from "./series.js";
import { keepConnected } from "./socket.js";

performance.mark("tfdash:scripts-run"); // every module of the page fetched, parsed and running: bench/page_load.py

const root = document.getElementById("live-metrics");
// Loaded `async`: it runs once its modules are fetched, without waiting for the rest of the page's parsing or its
// deferred scripts, so the socket opens while uPlot still loads (the charts wait for it: charts.js).
if (root) start(root);

function start(root) {
  const emptyEl = document.getElementById("live-empty");
  const downsampledEl = document.getElementById("live-downsampled");
  const factsEl = document.getElementById("task-facts");
  const stragglersEl = document.getElementById("stragglers");
  const liveEl = document.getElementById("job-live");
  const cancelEl = document.getElementById("cancel-form");
  const namesEl = document.getElementById("task-names");
  const taskNames = namesEl ? JSON.parse(namesEl.textContent) : {};
  const page = { downsampled: false, stragglers: [], paces: new Map(), jobFrames: 0, taskFrames: 0, state: null, timing: null };

  // Names come with the page; a task placed after it loaded is named by the task frames (and its table row).
  function taskLabel(task) {
    if (!taskNames[task]) {
      const row = document.querySelector(`tr[data-task-id="${Number(task)}"]`);
      if (row && row.dataset.taskLabel) taskNames[task] = row.dataset.taskLabel;
    }
    return taskNames[task] || `task ${task}`;
  }

  const store = new SeriesStore();
  const charts = new Charts(document.getElementById("charts"), store, taskLabel, afterDraw);
  const logs = new LogTail(document.getElementById("log-tail"), Number(root.dataset.jobId), Number(root.dataset.logLines) || 60);

  function afterDraw() {
    if (store.stepTimesChanged) {
      store.stepTimesChanged = false;
      const rows = document.querySelectorAll("tr[data-task-id]");
      const current = rows.length ? new Set([...rows].map((r) => Number(r.dataset.taskId))) : null;
      const { paces, flagged } = store.stragglers(current);
      page.paces = paces;
      page.stragglers = flagged;
      showStragglers();
    }
    if (emptyEl) emptyEl.hidden = charts.entries.size > 0;
  }

  // Shown live in the task table's Pace column and in a line above the charts; only tasks of the current placement
  // (the table's rows) take part.
  function showStragglers() {
    const flagged = new Set(page.stragglers.map((s) => s.task));
    for (const row of document.querySelectorAll("tr[data-task-id]")) {
      const task = Number(row.dataset.taskId);
      const cell = row.querySelector("td.pace");
      const ratio = page.paces.get(task);
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
    stragglersEl.textContent = page.stragglers
      .map((s) => `Straggler: ${taskLabel(s.task)}: recent step time ${s.median.toFixed(3)} s, ${s.ratio.toFixed(1)}× the other tasks' ${s.others.toFixed(3)} s.`)
      .join(" ");
  }

  function onJob(frame) {
    page.jobFrames += 1;
    page.state = frame.state;
    if (liveEl && typeof frame.html === "string") replaceWithMarkup(liveEl, frame.html); // never innerHTML
    if (cancelEl) cancelEl.hidden = Boolean(frame.terminal);
    showStragglers(); // the fresh rows get their pace back
  }

  // The job's epoch k of N and ETA (Job.progress), in the words the server wrote for it (orchestrator/core/progress.py
  // describe). Its element is part of #job-live, which each `job` frame renders again with the stored progress.
  let progress = null;
  function onProgress(frame) {
    progress = frame.progress && typeof frame.progress === "object" ? { ...frame.progress } : null;
    const el = document.getElementById("job-progress");
    if (!el || typeof frame.text !== "string") return;
    el.textContent = frame.text;
    el.hidden = frame.text === "";
  }

  function onTasks(frame) {
    page.taskFrames += 1;
    for (const t of frame.tasks || []) if (!taskNames[t.id]) taskNames[t.id] = t.label;
    logs.onTasks(frame.tasks || []);
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

  const conn = keepConnected({
    path: root.dataset.wsPath,
    probeUrl: root.dataset.probeUrl,
    query() {
      const params = new URLSearchParams({ since: String(store.cursor) });
      const logSince = logs.cursorParam();
      if (logSince) params.set("log_since", logSince);
      return params.toString();
    },
    statusEl: document.getElementById("live-status"),
    onFrame(frame) {
      switch (frame.type) {
        case "metrics":
          store.addPoints(frame);
          if (frame.downsampled) page.downsampled = true;
          if (frame.history) return; // drawn once whole, at `history_end`: one draw, not one per frame
          break;
        case "history_end":
          if (!page.timing) {
            performance.mark("tfdash:history-end");
            page.timing = frame.timing && typeof frame.timing === "object" ? { ...frame.timing } : {};
          }
          store.advance(frame.cursor);
          if (frame.downsampled) page.downsampled = true;
          if (downsampledEl) downsampledEl.hidden = !page.downsampled;
          conn.healthy();
          break;
        case "hosts":
          store.addHostSamples(frame);
          break;
        case "facts":
          onFacts(frame);
          break;
        case "progress":
          onProgress(frame);
          return; // nothing to draw
        case "job":
          onJob(frame);
          break;
        case "task":
          onTasks(frame);
          break;
        case "log":
          logs.onLines(frame.task, frame.lines || [], frame.cursor);
          break;
        default:
          return;
      }
      charts.schedule();
    },
  });

  window.tfdashLive = Object.freeze({
    get status() { return conn.status; },
    get cursor() { return store.cursor; },
    get pointsReceived() { return store.pointsReceived; },
    get duplicatesReceived() { return store.duplicatesReceived; },
    get hostSamplesReceived() { return store.hostSamplesReceived; },
    get framesReceived() { return conn.framesReceived; },
    get reconnects() { return conn.reconnects; },
    get connectAttempts() { return conn.connectAttempts; },
    get retryScheduled() { return conn.retryScheduled; },
    get redraws() { return charts.redraws; },
    get downsampled() { return page.downsampled; },
    /** Milliseconds from navigation start to the end of the first chart's first draw; null before. */
    get firstDrawMs() { return charts.firstDrawMs; },
    /** The server's own times (ms) for the first connection's reads, as its `history_end` frame said them. */
    get serverTiming() { return page.timing ? { ...page.timing } : null; },
    /** `job` and `task` frames received, and the job's state as the last `job` frame said. */
    get jobFrames() { return page.jobFrames; },
    get taskFrames() { return page.taskFrames; },
    get jobState() { return page.state; },
    /** The job's progress as the last `progress` frame said it (null before one). */
    get progress() { return progress ? { ...progress } : null; },
    /** Log lines received over the socket (each once). */
    get logLinesReceived() { return logs.linesReceived; },
    /** Tasks flagged as stragglers now: [{task, median, others, ratio}]. */
    get stragglers() { return page.stragglers.map((s) => ({ ...s })); },
    /** Points held for metric `name` over every task and phase. */
    seriesPointCount(name) {
      let count = 0;
      for (const s of store.metrics.values()) if (s.name === name) count += s.xs.length;
      return count;
    },
    /** Ids of every metric point held (all of them unless a series passed its cap), ascending. */
    pointIds() {
      const ids = [];
      for (const s of store.metrics.values()) ids.push(...s.ids);
      return ids.sort((a, b) => a - b);
    },
    chartPoints: (id) => charts.points(id),
    chartSeries: (id) => charts.series(id),
    chartValues: (id, index) => charts.values(id, index),
  });
}
