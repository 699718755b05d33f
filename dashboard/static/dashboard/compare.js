// The comparison page's charts: one uPlot chart per epoch-end metric, one series per compared job, overlaid on an
// epoch axis or, by the "x axis" toggle, on wall time (seconds since each job's first task started), so two
// strategies run on the same hardware can be read against each other. The numbers come from the page itself
// (json_script "compare-data"); labels reach the DOM only through uPlot, which writes them as text.
//
// State for tests and curious people: window.tfdashCompare (read-only).
(() => {
  "use strict";

  const dataEl = document.getElementById("compare-data");
  const chartsEl = document.getElementById("charts");
  if (!dataEl || !chartsEl || typeof uPlot === "undefined") return;

  const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#bf3989", "#6e7781"];
  const AXIS_LABEL = { epoch: "epoch", elapsed: "seconds since start" };
  let data = JSON.parse(dataEl.textContent);
  const charts = [];
  const state = { axis: "epoch", charts: 0, draws: 0, resizes: 0 };

  function seriesOf(job, metric, axis) {
    const xs = [];
    const ys = [];
    const values = job.values[metric] || [];
    job[axis].forEach((x, i) => {
      if (x !== null && x !== undefined) {
        xs.push(x);
        ys.push(values[i] === undefined ? null : values[i]);
      }
    });
    const order = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
    return [order.map((i) => xs[i]), order.map((i) => ys[i])];
  }

  function widthOf(el) {
    return Math.max(200, Math.floor(el.clientWidth || 600));
  }

  function draw() {
    for (const chart of charts) chart.u.destroy();
    charts.length = 0;
    chartsEl.replaceChildren();
    const axis = state.axis;
    for (const metric of data.metrics) {
      const jobs = [];
      const tables = [];
      for (const job of data.jobs) {
        const table = seriesOf(job, metric, axis);
        if (table[1].some((v) => v !== null)) {
          jobs.push(job);
          tables.push(table);
        }
      }
      if (!tables.length) continue;
      const figure = document.createElement("figure");
      figure.className = "chart";
      figure.dataset.chart = metric;
      const caption = document.createElement("figcaption");
      caption.textContent = `${metric} per ${axis === "epoch" ? "epoch" : "wall time"}`;
      const plot = document.createElement("div");
      plot.className = "plot";
      figure.append(caption, plot);
      chartsEl.append(figure);
      const opts = {
        width: widthOf(plot),
        height: 240,
        // Every job's wall time starts at 0; epochs are whole numbers.
        scales: { x: { time: false, range: (u, min, max) => [axis === "elapsed" ? 0 : min, max > min ? max : min + 1] } },
        axes: [{ label: AXIS_LABEL[axis], incrs: axis === "epoch" ? [1, 2, 5, 10, 20, 50, 100, 200, 500] : undefined }, { size: 60 }],
        series: [
          { label: AXIS_LABEL[axis] },
          ...jobs.map((job) => ({
            label: job.label,
            stroke: COLORS[data.jobs.indexOf(job) % COLORS.length],
            width: 1.5,
            spanGaps: true,
            points: { show: true, size: 5 },
          })),
        ],
      };
      const table = tables.length === 1 ? tables[0] : uPlot.join(tables);
      charts.push({ plot, u: new uPlot(opts, table, plot) });
    }
    state.charts = charts.length;
    state.draws += 1;
  }

  for (const input of document.querySelectorAll('input[name="x-axis"]')) {
    input.addEventListener("change", () => {
      if (!input.checked) return;
      state.axis = input.value;
      draw();
    });
  }

  // Charts follow their box (a rotated phone, a narrowed window); a burst of changes gives one resize.
  let resizeTimer = null;
  new ResizeObserver(() => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const chart of charts) chart.u.setSize({ width: widthOf(chart.plot), height: 240 });
      state.resizes += 1;
    }, 100);
  }).observe(chartsEl);

  // The experiment page's live part (htmx, every few seconds while it runs) brings the curves' data anew: redrawn
  // only when it changed.
  document.body.addEventListener("htmx:afterSettle", () => {
    const liveEl = document.getElementById("experiment-chart-data");
    if (!liveEl || liveEl.textContent === JSON.stringify(data)) return;
    const fresh = JSON.parse(liveEl.textContent);
    if (JSON.stringify(fresh) === JSON.stringify(data)) return;
    data = fresh;
    draw();
  });

  const checked = document.querySelector('input[name="x-axis"]:checked');
  if (checked) state.axis = checked.value;
  draw();

  Object.defineProperty(window, "tfdashCompare", {
    get: () => ({ ...state }),
  });
})();
