// The analyst's views: their datasets and budgets, their releases (paged), one release.
import { api, enc } from "./api.js";
import { h, fill, show, number, when, privacy, errorBox } from "./dom.js";
import { spentOverTime, errorBars } from "./charts.js";

const PAGE = 20;

function meter(label, view, testid) {
  const total = view.total.epsilon ?? view.total.rho ?? 0;
  const spent = view.spent.epsilon ?? view.spent.rho ?? 0;
  return h("div", { "data-testid": testid },
    h("small", {}, `${label}: spent ${privacy(view.spent)} of ${privacy(view.total)}; left ${privacy(view.remaining)}`),
    h("progress", { value: Math.min(spent, total), max: total || 1 }));
}

export async function datasetsView() {
  const { datasets } = await api("/v1/datasets");
  const cards = await Promise.all(datasets.map(async (d) => {
    const [budget, ledger] = await Promise.all([
      api(`/v1/datasets/${enc(d.name)}/budget`),
      api(`/v1/datasets/${enc(d.name)}/ledger?limit=500`),
    ]);
    const unit = budget.total.epsilon !== undefined ? "epsilon" : "rho";
    return h("article", { "data-testid": `dataset-${d.name}` },
      h("header", {}, h("h3", {}, d.name),
        h("small", { class: "muted" }, `privacy unit: ${d.privacy_unit ?? "one row per person"}; columns: ${Object.keys(d.columns).join(", ")}`)),
      meter("Your budget", budget, "my-budget"),
      meter("The dataset's budget (all analysts)", budget.dataset, "dataset-budget"),
      ledger.charges.length
        ? spentOverTime(ledger.charges, budget.total[unit] ?? 0, unit, ledger.next === null)
        : h("p", { class: "muted" }, "Nothing spent yet."),
      ledger.next ? h("small", { class: "muted" }, "The chart shows your newest 500 charges.") : null,
      h("footer", { class: "pager" },
        h("a", { href: `#/ask/${enc(d.name)}`, role: "button" }, "Ask"),
        h("a", { href: `#/history/${enc(d.name)}` }, "Your releases"),
        h("a", { href: `#/meaning/${enc(d.name)}` }, "What ε means")));
  }));
  show(h("h2", {}, "Your datasets"),
       datasets.length ? h("div", { class: "grid-cards" }, cards) : h("p", {}, "You have no budget on any dataset."));
}

function queryText(label) {
  // The ledger labels a request "<analyst>: <query>"; the analyst knows who they are.
  const at = label.indexOf(": ");
  return at >= 0 ? label.slice(at + 2) : label;
}

export async function historyView(dataset, before) {
  const query = `limit=${PAGE}` + (before ? `&before=${enc(before)}` : "");
  const page = await api(`/v1/datasets/${enc(dataset)}/history?${query}`);
  const rows = page.releases.map((r) => h("tr", { "data-testid": "history-row" },
    h("td", {}, when(r.time)),
    h("td", { class: "sql" }, queryText(r.label)),
    h("td", {}, r.release ? privacy(r.release.privacy) : "not answered (retry with its key)"),
    h("td", {}, r.release ? h("a", { href: `#/release/${enc(dataset)}/${enc(r.query_id)}` }, "open") : "")));
  show(
    h("h2", {}, `Your releases on ${dataset}`),
    h("p", { class: "muted" }, "Newest first. Opening one sends it again for free."),
    rows.length
      ? h("table", { "data-testid": "history" },
          h("thead", {}, h("tr", {}, h("th", {}, "asked"), h("th", {}, "query"), h("th", {}, "cost"), h("th", {}, ""))),
          h("tbody", {}, rows))
      : h("p", {}, "No releases yet."),
    h("div", { class: "pager" },
      before ? h("a", { href: `#/history/${enc(dataset)}` }, "← newest") : null,
      page.next ? h("a", { href: `#/history/${enc(dataset)}/before/${enc(page.next)}`, "data-testid": "older" }, "older →") : null,
      h("a", { href: `#/ask/${enc(dataset)}` }, "Ask a query")));
}

// The release's table (each value beside its interval) and one error-bar chart per measure.
export function releaseBody(release) {
  const rows = release.rows || [];
  const intervals = release.intervals || [];
  const columns = rows.length ? Object.keys(rows[0]) : [];
  const measures = columns.filter((c) => intervals.length && intervals[0] && intervals[0][c]);
  const keys = columns.filter((c) => !measures.includes(c));
  const table = h("table", { "data-testid": "release-table" },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)),
      measures.map((m) => h("th", {}, `${m}: ${Math.round(release.confidence * 100)}% interval`)))),
    h("tbody", {}, rows.map((row, i) => h("tr", {},
      columns.map((c) => h("td", { class: measures.includes(c) ? "num" : "" }, number(row[c]))),
      measures.map((m) => h("td", { class: "num" }, `[${number(intervals[i][m][0])}, ${number(intervals[i][m][1])}]`))))));
  const labels = rows.map((row) => keys.map((k) => String(row[k])).join(" · ") || "all");
  const charts = measures.map((m) => h("section", {}, h("h4", {}, m),
    errorBars(labels, rows.map((r) => r[m]), intervals.map((iv) => iv[m]), m, release.confidence)));
  return [table, ...charts,
    (release.warnings || []).length ? h("ul", {}, release.warnings.map((w) => h("li", { class: "warn" }, w))) : null];
}

export async function releaseView(dataset, id) {
  const path = `/v1/datasets/${enc(dataset)}/queries/${enc(id)}`;
  const release = await api(path);
  const status = h("div", {});
  const replay = async () => {
    try {
      const again = await api(path);
      fill(status, h("p", { class: "ok", "data-testid": "replayed" },
        `Sent again for free (nothing charged); you have ${privacy(again.remaining)} left.`));
    } catch (error) {
      fill(status, errorBox(error));
    }
  };
  show(
    h("h2", {}, `Release on ${dataset}`),
    h("article", {},
      h("p", { class: "sql", "data-testid": "release-query" }, queryText(release.label || "")),
      h("p", {}, h("span", { "data-testid": "release-cost" }, `Cost: ${privacy(release.privacy)} (${release.privacy?.neighbouring ?? ""})`),
        h("br"), h("small", { class: "muted" }, `Asked ${when(release.time)}; intervals at ${Math.round(release.confidence * 100)}% confidence.`)),
      ...releaseBody(release),
      h("footer", {}, h("button", { type: "button", class: "secondary", id: "replay", onclick: replay }, "Replay (free)"), status)),
    h("a", { href: `#/history/${enc(dataset)}` }, "← your releases"));
}
