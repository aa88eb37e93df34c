// The query in the editor, per dataset, kept in this tab (the "What ε means" page reads it).
const key = (dataset) => `dpcurator.draft.${dataset}`;

export function loadDraft(dataset) {
  try {
    const found = JSON.parse(sessionStorage.getItem(key(dataset)));
    if (found && typeof found.sql === "string") return found;
  } catch { /* no draft yet */ }
  return { sql: "SELECT COUNT(*) AS n FROM data", epsilon: 0.1, delta: "" };
}

export function saveDraft(dataset, draft) {
  sessionStorage.setItem(key(dataset), JSON.stringify(draft));
}

// The body of a query or explain request for a draft.
export function body(draft, epsilon = draft.epsilon) {
  const out = { sql: draft.sql, epsilon: Number(epsilon) };
  if (draft.delta !== "" && draft.delta !== null && draft.delta !== undefined) out.delta = Number(draft.delta);
  return out;
}

// Each output's 95% error, from explain's noise: {"n": 49.9, "mean · values": 24964, ...}.
export function errors(explained) {
  const out = {};
  for (const [column, parts] of Object.entries(explained.noise || {})) {
    for (const part of parts) {
      out[parts.length > 1 ? `${column} · ${part.measure}` : column] = part.error_95;
    }
  }
  return out;
}
