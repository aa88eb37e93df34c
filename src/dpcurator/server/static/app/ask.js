// Ask: the editor shows the cost in both budgets and each output's error before anything is
// spent (explain is free), finds the ε for an accepted error, and asks before spending much.
import { api, enc } from "./api.js";
import { h, fill, show, number, privacy, errorBox } from "./dom.js";
import { loadDraft, saveDraft, body, errors } from "./draft.js";

export const CONFIRM_SHARE = 0.25; // confirm a query costing more than this share of what is left

// The cost's largest share of what is left, over both budgets and every unit.
function shareOfLeft(explained, budget) {
  let share = 0;
  for (const [cost, left] of [[explained.cost, budget.remaining], [explained.dataset_cost, budget.dataset.remaining]]) {
    for (const unit of ["epsilon", "delta", "rho"]) {
      const c = cost[unit] || 0;
      if (c > 0) share = Math.max(share, (left[unit] ?? 0) > 0 ? c / left[unit] : Infinity);
    }
  }
  return share;
}

function confirmSpend(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    const yes = document.getElementById("confirm-yes");
    const no = document.getElementById("confirm-no");
    const done = (answer) => { yes.onclick = no.onclick = null; dialog.close(); resolve(answer); };
    yes.onclick = () => done(true);
    no.onclick = () => done(false);
    dialog.showModal();
  });
}

// The ε whose error for `output` is at most `target`: explain at a few ε, assuming the error
// moves as a power of ε between them (about 1/ε; the slope is measured as it goes).
export async function epsilonFor(dataset, draft, output, target) {
  const errorAt = async (eps) => errors(await api(`/v1/datasets/${enc(dataset)}/explain`, body(draft, eps)))[output];
  let eps = Number(draft.epsilon) > 0 ? Number(draft.epsilon) : 1;
  let error = await errorAt(eps);
  let slope = 1;
  for (let step = 0; step < 6 && Math.abs(error / target - 1) > 0.01; step += 1) {
    const next = Math.min(100, Math.max(1e-4, eps * (error / target) ** (1 / slope)));
    const nextError = await errorAt(next);
    const measured = Math.log(error / nextError) / Math.log(next / eps);
    if (Number.isFinite(measured) && measured > 0.2) slope = measured;
    eps = next;
    error = nextError;
  }
  let rounded = Number(eps.toPrecision(3));
  if (rounded < eps) rounded = Number((rounded + 10 ** (Math.floor(Math.log10(eps)) - 2)).toPrecision(3));
  return { epsilon: rounded, error: await errorAt(rounded) };
}

export async function askView(dataset) {
  const draft = loadDraft(dataset);
  let budget = await api(`/v1/datasets/${enc(dataset)}/budget`);
  let explained = null;

  const sql = h("textarea", { id: "sql", class: "sql-editor", name: "sql", spellcheck: "false" });
  sql.value = draft.sql;
  const epsilon = h("input", { id: "epsilon", name: "epsilon", type: "number", step: "any", min: "0", value: draft.epsilon });
  const delta = h("input", { id: "delta", name: "delta", type: "number", step: "any", min: "0", placeholder: "0 (pure ε-DP)", value: draft.delta });
  const left = h("p", { "data-testid": "budget-left" });
  const preview = h("article", { "data-testid": "preview" }, h("p", { class: "muted" }, "The cost appears here before anything is spent."));
  const result = h("div", { "data-testid": "result" });
  const output = h("select", { id: "output", "aria-label": "output" });
  const target = h("input", { id: "target", type: "number", step: "any", min: "0", placeholder: "± error you accept" });
  const found = h("small", { "data-testid": "found" });
  const ask = h("button", { type: "button", id: "ask", disabled: true }, "Ask");

  const showLeft = () => fill(left, 
    `You have ${privacy(budget.remaining)} left of ${privacy(budget.total)}; the dataset has ${privacy(budget.dataset.remaining)} left of ${privacy(budget.dataset.total)} for all analysts.`);
  showLeft();

  const current = () => ({ sql: sql.value, epsilon: epsilon.value, delta: delta.value });
  let timer = null;
  let asked = 0;
  const explain = async () => {
    const mine = ++asked;
    saveDraft(dataset, current());
    ask.disabled = true;
    try {
      const answer = await api(`/v1/datasets/${enc(dataset)}/explain`, body(current()));
      if (mine !== asked) return;
      explained = answer;
      const errs = errors(answer);
      const chosen = output.value;
      fill(output, ...Object.keys(errs).map((name) => h("option", { value: name }, name)));
      if (chosen in errs) output.value = chosen;
      const share = shareOfLeft(answer, budget);
      fill(preview, 
        h("h4", {}, "Before you spend"),
        h("p", { "data-testid": "cost" },
          `Cost to your budget: ${privacy(answer.cost)}; to the dataset's: ${privacy(answer.dataset_cost)}`,
          h("br"), h("small", { class: "muted" }, Number.isFinite(share) ? `${number(share * 100, 3)}% of what is left (the larger of the two)` : "more than is left")),
        h("table", { "data-testid": "errors" },
          h("thead", {}, h("tr", {}, h("th", {}, "output"), h("th", {}, "noise"), h("th", { class: "num" }, `± error (${Math.round(answer.confidence * 100)}%)`))),
          h("tbody", {}, Object.entries(answer.noise).flatMap(([column, parts]) => parts.map((p) =>
            h("tr", {}, h("td", {}, parts.length > 1 ? `${column} · ${p.measure}` : column),
              h("td", {}, `${p.noise}, scale ${number(p.scale)}`), h("td", { class: "num" }, number(p.error_95))))))),
        (answer.warnings || []).length ? h("ul", {}, answer.warnings.map((w) => h("li", { class: "warn" }, w))) : null);
      ask.textContent = `Ask (spends ${privacy(answer.cost)})`;
      ask.disabled = false;
    } catch (error) {
      if (mine !== asked) return;
      explained = null;
      fill(preview, errorBox(error));
    }
  };
  const later = () => { clearTimeout(timer); timer = setTimeout(explain, 300); };
  for (const input of [sql, epsilon, delta]) input.addEventListener("input", later);

  const findEpsilon = async () => {
    const wanted = Number(target.value);
    if (!(wanted > 0) || !output.value) { found.textContent = "Give the error you accept (a number > 0) for an output."; return; }
    found.textContent = "finding…";
    try {
      const best = await epsilonFor(dataset, current(), output.value, wanted);
      epsilon.value = best.epsilon;
      found.textContent = `ε ${best.epsilon} gives ${output.value} ± ${number(best.error)}`;
      await explain();
    } catch (error) {
      fill(found, errorBox(error));
    }
  };

  const send = async () => {
    if (!explained) return;
    const share = shareOfLeft(explained, budget);
    if (share > CONFIRM_SHARE) {
      const text = `This query costs ${privacy(explained.cost)} of your budget and ${privacy(explained.dataset_cost)} of the dataset's: ${Number.isFinite(share) ? number(share * 100, 3) + "%" : "more than all"} of what is left.`;
      if (!(await confirmSpend(text))) return;
    }
    ask.disabled = true;
    fill(result, h("p", { "aria-busy": "true" }, "asking…"));
    try {
      const answer = await api(`/v1/datasets/${enc(dataset)}/queries`, body(current()));
      budget = await api(`/v1/datasets/${enc(dataset)}/budget`);
      showLeft();
      location.hash = `#/release/${enc(dataset)}/${enc(answer.query_id)}`;
    } catch (error) {
      const refused = error.status !== undefined && error.status < 500;
      fill(result, h("h4", {}, refused ? "Refused: nothing was charged" : "Failed"), errorBox(error));
      ask.disabled = false;
    }
  };
  ask.addEventListener("click", send);

  show(
    h("h2", {}, `Ask ${dataset}`),
    left,
    h("label", { for: "sql" }, "DP SQL (the table is data)"), sql,
    h("div", { class: "grid" },
      h("label", {}, "ε", epsilon),
      h("label", {}, "δ (optional)", delta)),
    h("details", {},
      h("summary", {}, "Choose ε from the error you accept"),
      h("div", { class: "grid" }, output, target,
        h("button", { type: "button", class: "secondary", id: "find-epsilon", onclick: findEpsilon }, "Find ε")),
      found),
    preview,
    h("div", { class: "pager" }, ask, h("a", { href: `#/meaning/${enc(dataset)}` }, "What does this ε mean?")),
    result);
  await explain();
}
