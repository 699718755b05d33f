// The log panel: a button per task of the current placement and the chosen task's last lines, kept live from the
// socket's `task` and `log` frames. Each task's cursor (the server's, from its `log` frames, or the one the page was
// served with) goes back to the server on a reconnect (`log_since`), so only what the page lacks is sent; lines are
// kept once per task by their seq (the agent numbers them) all the same, so an out-of-order commit shows once.

export class LogTail {
  constructor(panel, jobId, keep) {
    this.panel = panel;
    this.jobId = jobId;
    this.keep = keep; // lines per task
    this.tasks = []; // [{id, label, host}], the current placement's
    this.lines = new Map(); // task id -> Map(seq -> [stream, text])
    this.cursors = new Map(); // task id -> log cursor: the server has sent every line up to it that the tail shows
    this.chosen = panel.dataset.taskId ? Number(panel.dataset.taskId) : null;
    this.linesReceived = 0;
    // What the page was served with: the buttons and the chosen task's lines.
    this.tasks = [...panel.querySelectorAll(".log-tabs button")].map((b) => ({ id: Number(b.dataset.taskId), label: b.textContent }));
    if (this.chosen !== null) {
      const held = new Map();
      for (const span of panel.querySelectorAll("#log-tail-text span[data-seq]")) {
        held.set(Number(span.dataset.seq), [span.className, span.textContent]);
      }
      this.lines.set(this.chosen, held);
      if (panel.dataset.logCursor) this.cursors.set(this.chosen, Number(panel.dataset.logCursor));
    }
    panel.addEventListener("click", (event) => {
      const button = event.target.closest(".log-tabs button");
      if (button) this.choose(Number(button.dataset.taskId));
    });
    this.scrollToEnd();
  }

  /** A `task` frame: the current placement's tasks (a new placement brings new buttons). */
  onTasks(tasks) {
    const same = tasks.length === this.tasks.length && tasks.every((t, i) => t.id === this.tasks[i].id);
    this.tasks = tasks.map((t) => ({ id: t.id, label: t.label, host: t.host }));
    for (const task of this.cursors.keys()) if (!tasks.some((t) => t.id === task)) this.cursors.delete(task);
    if (!tasks.some((t) => t.id === this.chosen)) this.chosen = tasks.length ? tasks[0].id : null;
    if (!same) this.renderButtons();
    this.renderText();
  }

  /** A `log` frame: lines [seq, stream, text] of one task, and the task's cursor after them. */
  onLines(task, lines, cursor) {
    if (typeof cursor === "number" && !(this.cursors.get(task) >= cursor)) this.cursors.set(task, cursor);
    let held = this.lines.get(task);
    if (!held) {
      held = new Map();
      this.lines.set(task, held);
    }
    for (const [seq, stream, text] of lines) {
      if (!held.has(seq)) this.linesReceived += 1;
      held.set(seq, [stream, text]);
    }
    if (held.size > this.keep) {
      const order = [...held.keys()].sort((a, b) => a - b);
      for (const seq of order.slice(0, held.size - this.keep)) held.delete(seq);
    }
    if (task === this.chosen) this.renderText();
  }

  /** What a reconnect passes as `log_since`: `<task>:<cursor>` per task, comma-separated. */
  cursorParam() {
    return [...this.cursors].map(([task, cursor]) => `${task}:${cursor}`).join(",");
  }

  choose(task) {
    this.chosen = task;
    for (const button of this.panel.querySelectorAll(".log-tabs button")) {
      button.setAttribute("aria-pressed", String(Number(button.dataset.taskId) === task));
    }
    this.renderText();
  }

  renderButtons() {
    let tabs = this.panel.querySelector(".log-tabs");
    if (!tabs) {
      tabs = document.createElement("div");
      tabs.className = "log-tabs";
      tabs.setAttribute("role", "group");
      tabs.setAttribute("aria-label", "Show the log of");
      this.panel.prepend(tabs);
    }
    tabs.replaceChildren(
      ...this.tasks.map((t) => {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "secondary";
        button.id = `log-tab-${t.id}`;
        button.dataset.taskId = String(t.id);
        button.setAttribute("aria-controls", "log-tail-text");
        button.setAttribute("aria-pressed", String(t.id === this.chosen));
        button.textContent = t.label;
        return button;
      }),
    );
  }

  renderText() {
    for (const old of this.panel.querySelectorAll(".log-tail-head, #log-tail-text, .log-tail-none")) old.remove();
    const task = this.tasks.find((t) => t.id === this.chosen);
    if (!task) {
      const none = document.createElement("p");
      none.className = "hint log-tail-none";
      none.textContent = "No task has been placed yet.";
      this.panel.append(none);
      return;
    }
    this.panel.dataset.taskId = String(task.id);
    const held = this.lines.get(task.id) || new Map();
    const head = document.createElement("p");
    head.className = "log-tail-head";
    const name = document.createElement("b");
    name.textContent = task.label;
    const full = link(`/jobs/${this.jobId}/tasks/${task.id}/log/`, "full log");
    const download = link(`/api/jobs/${this.jobId}/logs/${task.id}/?download=1`, "download");
    download.setAttribute("download", "");
    head.append(name, `${task.host ? ` on ${task.host}` : ""} · last ${held.size} lines · `, full, " · ", download);
    const pre = document.createElement("pre");
    pre.className = "log";
    pre.id = "log-tail-text";
    pre.tabIndex = 0;
    pre.setAttribute("aria-label", `last lines of ${task.label}`);
    const seqs = [...held.keys()].sort((a, b) => a - b);
    if (!seqs.length) pre.textContent = "No output yet.";
    for (const seq of seqs) {
      const [stream, text] = held.get(seq);
      const span = document.createElement("span");
      span.className = stream;
      span.dataset.seq = String(seq);
      span.textContent = text;
      pre.append(span, "\n");
    }
    this.panel.append(head, pre);
    this.scrollToEnd();
  }

  scrollToEnd() {
    const pre = this.panel.querySelector("#log-tail-text");
    if (pre) pre.scrollTop = pre.scrollHeight;
  }
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}
