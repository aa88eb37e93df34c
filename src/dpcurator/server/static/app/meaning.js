// What ε means: how far it lets an attacker's belief about one person move (the accounting
// package's posterior bounds, from /v1/posterior), and how wide the editor's query's answer
// is at each ε (from explain, free).
import { api, enc } from "./api.js";
import { h, fill, show, number, errorBox } from "./dom.js";
import { posterior, widthAgainstEpsilon } from "./charts.js";
import { loadDraft, body, errors } from "./draft.js";

// A few ε on a log scale: each is one explain (free, about 15 ms of the server's time).
const EPSILONS = [0.05, 0.1, 0.5, 1, 2];

export async function meaningView(dataset) {
  const draft = loadDraft(dataset);
  const budget = await api(`/v1/datasets/${enc(dataset)}/budget`);
  const epsilon = h("input", { id: "meaning-epsilon", type: "number", step: "any", min: "0", value: draft.epsilon || 1 });
  const delta = h("input", { id: "meaning-delta", type: "number", step: "any", min: "0", value: draft.delta || 0 });
  const prior = h("input", { id: "prior", type: "range", min: "0", max: "1", step: "0.01", value: "0.5" });
  const said = h("p", { "data-testid": "posterior-text" });
  const chart = h("div", {});
  const widths = h("div", {});

  const draw = async () => {
    try {
      const query = new URLSearchParams({ epsilon: epsilon.value, delta: delta.value || 0, prior: prior.value });
      const answer = await api(`/v1/posterior?${query}`);
      const pct = (p) => `${number(p * 100, 3)}%`;
      fill(said, 
        `An attacker who believed with ${pct(answer.prior)} that one person is in the data believes, after any answer, between ${pct(answer.posterior_min)} and ${pct(answer.posterior_max)}`,
        answer.failure_probability > 0 ? ` (except on answers of probability at most ${number(answer.failure_probability)}; the odds move by e^${number(answer.epsilon_bound)})` : "",
        ".");
      fill(chart, posterior(answer.curve, epsilon.value));
    } catch (error) {
      fill(said, errorBox(error));
    }
  };
  for (const input of [epsilon, delta, prior]) input.addEventListener("change", draw);
  const pick = (eps, del) => () => { epsilon.value = eps; delta.value = del || 0; draw(); };

  show(
    h("h2", {}, "What ε means"),
    h("p", { class: "muted" }, "Differential privacy bounds how much any answer can move an attacker's belief that one person's records are in the data, whatever else they know."),
    h("div", { class: "pager" },
      h("button", { type: "button", class: "secondary", id: "use-query", onclick: pick(draft.epsilon, draft.delta) }, `The editor's query (ε ${draft.epsilon})`),
      h("button", { type: "button", class: "secondary", id: "use-budget", onclick: pick(budget.total.epsilon ?? 1, budget.total.delta) }, `Your whole budget (ε ${number(budget.total.epsilon ?? NaN)})`)),
    h("div", { class: "grid" }, h("label", {}, "ε", epsilon), h("label", {}, "δ", delta),
      h("label", {}, "prior", prior)),
    said, chart,
    h("h3", {}, "How wide the answer is at each ε"),
    h("p", { class: "sql" }, draft.sql),
    widths,
    h("a", { href: `#/ask/${enc(dataset)}` }, "← back to the editor"));
  await draw();
  try {
    const series = {};
    const explained = await Promise.all(EPSILONS.map((eps) => api(`/v1/datasets/${enc(dataset)}/explain`, body(draft, eps))));
    explained.forEach((answer, i) => {
      for (const [name, error] of Object.entries(errors(answer))) {
        (series[name] ||= []).push({ x: EPSILONS[i], y: error });
      }
    });
    const mine = errors(await api(`/v1/datasets/${enc(dataset)}/explain`, body(draft)));
    const current = Object.values(mine).map((y) => ({ x: Number(draft.epsilon), y }));
    fill(widths, widthAgainstEpsilon(series, current));
  } catch (error) {
    fill(widths, errorBox(error));
  }
}
