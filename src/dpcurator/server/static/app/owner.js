// The owner's view: every dataset and analyst, the ledger's state, the audit log's newest lines.
import { api } from "./api.js";
import { h, show, number, when, privacy } from "./dom.js";

const pct = (share) => `${number(share * 100, 3)}%`;

export async function ownerView() {
  const [view, audit] = await Promise.all([api("/v1/owner/overview"), api("/v1/owner/audit?limit=200")]);
  const ledger = view.ledger;
  const near = view.analysts.filter((a) => a.near_limit);
  show(
    h("h2", {}, "Owner's overview"),
    h("article", { "data-testid": "ledger" },
      h("h3", {}, "Ledger"),
      ledger.verified
        ? h("p", { class: "ok" }, `✓ verifies (last verified whole ${when(ledger.verified_at)}, every ${ledger.verify_every_s} s)`)
        : h("p", { class: "error", role: "alert" }, `✗ does not verify: ${ledger.error ?? ledger.status}`),
      ledger.head ? h("p", {}, `Head: entry ${ledger.head.entry}, hash `, h("span", { class: "hash", "data-testid": "head-hash" }, ledger.head.hash)) : null,
      ledger.stale ? h("p", { class: "warn" }, "Budgets below are as this service last saw them.") : null),
    h("h3", {}, "Datasets"),
    h("table", { "data-testid": "owner-datasets" },
      h("thead", {}, h("tr", {}, ["dataset", "total", "spent", "left", "share spent"].map((t) => h("th", {}, t)))),
      h("tbody", {}, view.datasets.map((d) => h("tr", {}, h("td", {}, d.name), h("td", {}, privacy(d.total)),
        h("td", {}, privacy(d.spent)), h("td", {}, privacy(d.remaining)), h("td", { class: "num" }, pct(d.share_spent)))))),
    h("h3", {}, "Analysts"),
    near.length
      ? h("p", { class: "warn", "data-testid": "near-limit" }, `Near their limit (${pct(view.near_limit_share)} or more spent): ${near.map((a) => a.name).join(", ")}`)
      : h("p", { class: "muted", "data-testid": "near-limit" }, "No analyst is near their limit."),
    h("table", { "data-testid": "owner-analysts" },
      h("thead", {}, h("tr", {}, ["analyst", "dataset", "total", "spent", "left", "share spent"].map((t) => h("th", {}, t)))),
      h("tbody", {}, view.analysts.flatMap((a) => a.budgets.map((b) => h("tr", { class: b.share_spent >= view.near_limit_share ? "near" : "" },
        h("td", {}, a.name), h("td", {}, b.dataset), h("td", {}, privacy(b.total)), h("td", {}, privacy(b.spent)),
        h("td", {}, privacy(b.remaining)), h("td", { class: "num" }, pct(b.share_spent))))))),
    h("h3", {}, `Audit log (newest ${audit.entries.length} lines, requests for the dashboard's own files left out)`),
    h("figure", { class: "scroll" }, h("table", { "data-testid": "audit" },
      h("thead", {}, h("tr", {}, ["time", "who", "action", "status", "dataset", "error", "query"].map((t) => h("th", {}, t)))),
      h("tbody", {}, audit.entries.filter((e) => e.action !== "dashboard").map((e) => h("tr", {},
        h("td", {}, e.time ? when(e.time) : ""), h("td", {}, e.analyst ?? (e.owner ? `${e.owner} (owner)` : e.client ?? "")),
        h("td", {}, e.action ?? e.path ?? ""), h("td", {}, e.status ?? ""), h("td", {}, e.dataset ?? ""),
        h("td", {}, e.error ?? ""), h("td", { class: "sql" }, e.sql ?? "")))))));
}
