// The usage page's chart: device-hours per account per day, stacked (the top edge is the day's total), drawn by
// uPlot from the page's own data (json_script "usage-data", built by dashboard/usage_views.py chart_data). Each
// account's band lies between its running sum and the one below it; the legend shows each account's own hours, not
// the sum. Names reach the DOM only through uPlot, which writes them as text. Days are UTC, as the server splits them.
//
// State for tests and curious people: window.tfdashUsage (read-only).
(() => {
  "use strict";

  const state = { drawn: false, accounts: 0, days: 0 };
  window.tfdashUsage = state;
  const dataEl = document.getElementById("usage-data");
  const plotEl = document.getElementById("usage-plot");
  if (!dataEl || !plotEl || typeof uPlot === "undefined") return;

  const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#bf3989", "#9a6700", "#57606a",
    "#0550ae", "#6e7781"];
  const data = JSON.parse(dataEl.textContent);
  const accounts = data.accounts;

  const sums = [];
  let below = data.days.map(() => 0);
  for (const account of accounts) {
    below = below.map((v, i) => v + account.hours[i]);
    sums.push(below);
  }

  const color = (n) => (accounts[n].name === "others" ? "#afb8c1" : COLORS[n % COLORS.length]);
  const own = (u, v, sidx, idx) => (idx === null || idx === undefined ? "--" : accounts[sidx - 1].hours[idx].toFixed(2));

  function widthOf(el) {
    return Math.max(300, Math.floor(el.clientWidth || 800));
  }

  const opts = {
    width: widthOf(plotEl),
    height: 300,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
    scales: { y: { range: (u, min, max) => [0, max > 0 ? max * 1.05 : 1] } },
    axes: [{}, { label: "device-hours", size: 60 }],
    series: [
      { label: "day (UTC)", value: "{YYYY}-{MM}-{DD}" },
      ...accounts.map((account, n) => ({
        label: account.name,
        stroke: color(n),
        fill: color(n) + "99",
        width: 1,
        points: { show: data.days.length < 60, size: 4 },
        value: own,
      })),
    ],
    bands: accounts.slice(1).map((_, n) => ({ series: [n + 2, n + 1] })),
  };
  const chart = new uPlot(opts, [data.days, ...sums], plotEl);
  state.drawn = true;
  state.accounts = accounts.length;
  state.days = data.days.length;

  new ResizeObserver(() => {
    const width = widthOf(plotEl);
    if (width !== chart.width) chart.setSize({ width, height: 300 });
  }).observe(plotEl);
})();
