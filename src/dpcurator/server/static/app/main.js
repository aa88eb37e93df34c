// The dashboard's router: the URL's fragment names the view; every view asks the API.
import { api, ApiError, signIn, signOut, token } from "./api.js";
import { h, fill, show, errorBox } from "./dom.js";
import { clearCharts } from "./charts.js";
import { datasetsView, historyView, releaseView } from "./analyst.js";
import { askView } from "./ask.js";
import { meaningView } from "./meaning.js";
import { ownerView } from "./owner.js";

const ROLE = "dpcurator.who";

function who() {
  try { return JSON.parse(sessionStorage.getItem(ROLE)); } catch { return null; }
}

function nav(me) {
  const items = [];
  if (me && me.role === "analyst") items.push(h("li", {}, h("a", { href: "#/" }, "Datasets")));
  if (me && me.role === "owner") items.push(h("li", {}, h("a", { href: "#/owner" }, "Overview")));
  if (me) {
    items.push(h("li", { "data-testid": "signed-in-as" }, `${me.name} (${me.role})`));
    items.push(h("li", {}, h("a", { href: "#/signin", onclick: () => signOut() }, "Sign out")));
  }
  document.getElementById("nav").replaceChildren(...items);
}

function signInView(message) {
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off",
                             placeholder: "dpc_…", required: true });
  const status = h("div", {});
  const form = h("form", {
    onsubmit: async (event) => {
      event.preventDefault();
      signIn(input.value.trim());
      try {
        const me = await api("/v1/whoami");
        sessionStorage.setItem(ROLE, JSON.stringify(me));
        location.hash = me.role === "owner" ? "#/owner" : "#/";
      } catch (error) {
        signOut();
        fill(status, errorBox(error));
      }
    },
  },
  h("label", { for: "token" }, "Your token (as the curator's owner gave it to you)"), input,
  h("button", { type: "submit", id: "sign-in" }, "Sign in"), status);
  show(h("article", {},
    h("h2", {}, "Sign in"),
    h("p", { class: "muted" }, "The token stays in this browser tab (sessionStorage) and is sent only to this service, as a bearer token. Closing the tab forgets it."),
    message ? errorBox(message) : null, form));
  input.focus();
}

async function route() {
  clearCharts();
  const hash = location.hash.replace(/^#\/?/, "");
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  const me = token() ? who() : null;
  nav(me);
  if (!me || parts[0] === "signin") {
    if (parts[0] !== "signin") location.hash = "#/signin";
    else signInView();
    return;
  }
  try {
    if (me.role === "owner") {
      await ownerView();
    } else if (parts[0] === "history") {
      await historyView(parts[1], parts[2] === "before" ? parts[3] : null);
    } else if (parts[0] === "release") {
      await releaseView(parts[1], parts[2]);
    } else if (parts[0] === "ask") {
      await askView(parts[1]);
    } else if (parts[0] === "meaning") {
      await meaningView(parts[1]);
    } else {
      await datasetsView();
    }
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      signOut();
      nav(null);
      signInView(error);
      return;
    }
    show(h("h2", {}, "Something went wrong"), errorBox(error));
  }
}

// One view at a time, in the order the fragment changed: a view still waiting for the API
// when the user (or a test) moves on would otherwise draw itself over the newer one.
let routing = Promise.resolve();
const next = () => { routing = routing.then(route, route); };
window.addEventListener("hashchange", next);
window.addEventListener("load", next);
