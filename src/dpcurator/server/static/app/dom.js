// Building the page: every value is written as text (never parsed as HTML).

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "text") node.textContent = String(value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Replace a node's children (null, undefined and false are left out).
export function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

export function show(...nodes) {
  return fill(document.getElementById("view"), ...nodes);
}

export function number(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (value === 0) return "0";
  const abs = Math.abs(value);
  if (abs >= 1e6 || abs < 1e-3) return value.toExponential(2);
  return Number(value.toPrecision(digits)).toLocaleString("en");
}

export function when(seconds) {
  return new Date(seconds * 1000).toLocaleString("en-GB");
}

// "ε 0.1, δ 1e-7" (or ρ) for a cost or an amount as the API writes them.
export function privacy(amount) {
  if (!amount) return "–";
  const parts = [];
  if (amount.epsilon !== undefined && amount.epsilon !== null) parts.push(`ε ${number(amount.epsilon)}`);
  if (amount.delta) parts.push(`δ ${number(amount.delta)}`);
  if (amount.rho !== undefined && amount.rho !== null) parts.push(`ρ ${number(amount.rho)}`);
  return parts.join(", ") || "–";
}

export function errorBox(error) {
  return h("p", { class: "error", role: "alert", "data-testid": "error" },
           error && error.message ? error.message : String(error));
}
