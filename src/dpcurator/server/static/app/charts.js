// Charts, drawn by Chart.js (and its error-bar plugin); each function draws into a canvas
// it makes, and returns the wrapper to put on the page.
import { h, when } from "./dom.js";

let registered = false;
const live = new Set();

function chartJs() {
  const Chart = window.Chart;
  if (!registered) {
    const bars = window.ChartErrorBars;
    Chart.register(bars.BarWithErrorBarsController, bars.BarWithErrorBar);
    Chart.defaults.animation = false; // pages draw at once (and screenshots are stable)
    Chart.defaults.maintainAspectRatio = false;
    registered = true;
  }
  return Chart;
}

// Forget the charts of the page before (a new view replaces the canvases).
export function clearCharts() {
  for (const chart of live) chart.destroy();
  live.clear();
}

function draw(config, attrs = {}) {
  const canvas = h("canvas", { role: "img", "aria-label": attrs.label || "chart" });
  const box = h("div", { class: attrs.small ? "chart small" : "chart", "data-testid": attrs.testid }, canvas);
  const Chart = chartJs();
  // Drawn once the box is on the page (Chart.js measures its parent).
  requestAnimationFrame(() => {
    if (canvas.isConnected) live.add(new Chart(canvas, config));
  });
  return box;
}

// Spent against time, up to now, with the budget's total as a flat line; `complete` when
// the charges go back to the first (the line then starts from nothing spent).
export function spentOverTime(charges, total, unit = "epsilon", complete = true) {
  const points = charges.map((c) => ({ x: c.time, y: c.spent[unit] ?? 0 })).sort((a, b) => a.x - b.x);
  const now = Math.max(Date.now() / 1000, points[points.length - 1].x + 1);
  if (complete) points.unshift({ x: points[0].x, y: 0 });
  points.push({ x: now, y: points[points.length - 1].y });
  const span = [points[0].x, now];
  return draw({
    type: "line",
    data: {
      datasets: [
        { label: `${unit} spent`, data: points, stepped: true, borderColor: "#1e6fd9", pointRadius: 2 },
        { label: "total", data: span.map((x) => ({ x, y: total })), borderColor: "#c0392b",
          borderDash: [6, 4], pointRadius: 0 },
      ],
    },
    options: {
      scales: {
        x: { type: "linear", min: span[0], max: span[1], ticks: { callback: (v) => when(v).slice(0, 17), maxTicksLimit: 5 } },
        y: { beginAtZero: true, title: { display: true, text: unit } },
      },
    },
  }, { label: "budget spent over time", testid: "spent-chart", small: true });
}

// One measure of a release: each group's value with its interval as an error bar.
export function errorBars(labels, values, intervals, measure, confidence) {
  return draw({
    type: "barWithErrorBars",
    data: {
      labels,
      datasets: [{
        label: `${measure} (${Math.round(confidence * 100)}% interval)`,
        data: values.map((y, i) => ({ y, yMin: intervals[i][0], yMax: intervals[i][1] })),
        backgroundColor: "rgba(30, 111, 217, 0.35)",
        borderColor: "#1e6fd9",
        borderWidth: 1,
        errorBarColor: "#222",
        errorBarWhiskerColor: "#222",
        errorBarLineWidth: 2,
        errorBarWhiskerLineWidth: 2,
      }],
    },
    options: { scales: { y: { beginAtZero: true } } },
  }, { label: `${measure} with intervals`, testid: `errorbars-${measure}` });
}

// The attacker's highest and lowest posterior against their prior.
export function posterior(curve, epsilon) {
  const pairs = (ys) => curve.prior.map((x, i) => ({ x, y: ys[i] }));
  return draw({
    type: "line",
    data: {
      datasets: [
        { label: `highest posterior (ε ${epsilon})`, data: pairs(curve.highest), borderColor: "#c0392b", pointRadius: 0 },
        { label: "lowest posterior", data: pairs(curve.lowest), borderColor: "#1e6fd9", borderDash: [6, 4], pointRadius: 0 },
        { label: "no information", data: [{ x: 0, y: 0 }, { x: 1, y: 1 }], borderColor: "#999", borderDash: [2, 3], pointRadius: 0 },
      ],
    },
    options: {
      scales: {
        x: { type: "linear", min: 0, max: 1, title: { display: true, text: "prior: the attacker's belief before" } },
        y: { min: 0, max: 1, title: { display: true, text: "posterior: after seeing the answer" } },
      },
    },
  }, { label: "posterior against prior", testid: "posterior-chart" });
}

// Each output's 95% error against ε (log scales), from explain at several ε.
export function widthAgainstEpsilon(series, current) {
  const colours = ["#1e6fd9", "#c0392b", "#27ae60", "#8e44ad", "#d35400", "#16a085"];
  const datasets = Object.entries(series).map(([name, points], i) => ({
    label: `${name}: 95% error`, data: points, borderColor: colours[i % colours.length], pointRadius: 3,
  }));
  if (current) {
    datasets.push({ label: "the editor's ε", data: current, borderColor: "#333", showLine: false, pointRadius: 6, pointStyle: "crossRot" });
  }
  return draw({
    type: "line",
    data: { datasets },
    options: {
      scales: {
        x: { type: "logarithmic", title: { display: true, text: "ε" } },
        y: { type: "logarithmic", title: { display: true, text: "interval half-width (95%)" } },
      },
    },
  }, { label: "error against epsilon", testid: "width-chart" });
}
