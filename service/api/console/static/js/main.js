// The console's shell: sign-in with an API key, the pages by URL fragment (#/gallery, #/enroll,
// #/verify, #/identify, #/duplicates, #/model), one place that turns a refused key into a sign-out.

import { ApiError, call, key, whenRefused } from "./api.js";
import * as duplicates from "./duplicates.js";
import { add, busy, field, h, replace, say, statusLine, takeFlash } from "./dom.js";
import * as enroll from "./enroll.js";
import * as gallery from "./gallery.js";
import { releaseAll } from "./images.js";
import { sentence } from "./words.js";
import * as identify from "./identify.js";
import * as model from "./model.js";
import * as verify from "./verify.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const signOutButton = document.getElementById("sign-out");
const banner = document.getElementById("banner");
const collectionLabel = document.getElementById("collection");

const PAGES = {
  gallery: { title: "Gallery", render: (m, ctx) => (ctx.rest.length ? gallery.renderSubject(m, ctx) : gallery.renderList(m, ctx)) },
  enroll: { title: "Enroll", render: enroll.render },
  verify: { title: "Verify", render: verify.render },
  identify: { title: "Identify", render: identify.render },
  duplicates: { title: "Duplicates", render: duplicates.render },
  model: { title: "Model", render: model.render },
};

let signedIn = false;

function route() {
  const hash = location.hash.startsWith("#/") ? location.hash.slice(2) : "gallery";
  const [pathPart, query = ""] = hash.split("?");
  const [name, ...rest] = pathPart.split("/").map((p) => decodeURIComponent(p));
  return { name: PAGES[name] ? name : "gallery", rest: rest.filter(Boolean), params: new URLSearchParams(query) };
}

async function show() {
  if (!signedIn) return;
  releaseAll();
  const { name, rest, params } = route();
  const page = PAGES[name];
  document.title = `${page.title} · facegate console`;
  for (const a of nav.querySelectorAll("a")) {
    if (a.getAttribute("href") === `#/${name}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  replace(main, h("p", { class: "note", role: "status" }, "Loading…"));
  try {
    await page.render(main, { rest, params, refresh: show });
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return; // signed out already
    const retry = h("button", { type: "button", class: "quiet" }, "Try again");
    retry.addEventListener("click", () => show());
    replace(main, h("h1", { tabindex: "-1" }, page.title), h("p", { class: "problem", role: "alert" }, sentence(error)), h("div", { class: "actions" }, retry));
  }
  const heading = main.querySelector("h1");
  const flashed = takeFlash();
  if (flashed && heading) heading.after(h("p", { class: "status ok", role: "status" }, flashed));
  if (heading) heading.focus({ preventScroll: false });
}

function enter(anonymous) {
  signedIn = true;
  nav.hidden = false;
  signOutButton.hidden = anonymous;
  banner.hidden = !anonymous;
  if (anonymous) {
    banner.textContent =
      "No API keys are configured: this service answers anyone who can reach it, this console included. Set FACEGATE_API_KEYS or FACEGATE_API_KEYS_FILE.";
  }
  show();
  showCollection();
}

// The key's collection (GET /readyz names it): the one gallery every page sees and changes.
async function showCollection() {
  try {
    const ready = await call("GET", "readyz");
    collectionLabel.textContent = `Collection: ${ready.collection}`;
    collectionLabel.hidden = false;
  } catch {
    collectionLabel.hidden = true; // not ready yet (503): the pages say why
  }
}

function signOut(message = null) {
  key.clear();
  signedIn = false;
  nav.hidden = true;
  signOutButton.hidden = true;
  collectionLabel.hidden = true;
  releaseAll();
  signInPage(message);
}

function signInPage(message) {
  document.title = "Sign in · facegate console";
  const status = statusLine();
  const form = h(
    "form",
    { class: "panel signin", "aria-labelledby": "signin-h" },
    h("h1", { id: "signin-h", tabindex: "-1" }, "Sign in"),
    h("p", {}, "Give an API key of this service. It is kept in this tab only, until you sign out or close the tab."),
    field("API key", { name: "key", type: "password", required: true, autocomplete: "off", spellcheck: "false" }),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Sign in")),
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const typed = form.elements.key.value.trim();
    await busy(form, async () => {
      key.set(typed);
      try {
        await call("GET", "models", { signIn: true });
      } catch (error) {
        key.clear();
        form.elements.key.select();
        if (error.status === 401) say(status, "problem", "The service refused this key (401 unauthorized). Check it and try again.");
        else say(status, "problem", sentence(error));
        return;
      }
      enter(false);
    });
  });
  replace(main, form);
  if (message) say(status, "problem", message);
  form.elements.key.focus();
}

whenRefused(() => signOut("The service refused the key (401 unauthorized): it may have been rotated. Sign in again."));
signOutButton.addEventListener("click", () => signOut());
window.addEventListener("hashchange", () => {
  if (location.hash.startsWith("#/")) show();
});
document.querySelector(".skip").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});

// Start: a key from this tab's session, or none when the service has no keys configured.
(async () => {
  try {
    await call("GET", "models", { signIn: true });
    enter(!key.get());
  } catch (error) {
    if (error.status === 401) {
      const had = Boolean(key.get());
      key.clear();
      signInPage(had ? "The service refused the key this tab held: sign in again." : null);
    } else {
      const retry = h("button", { type: "button", class: "quiet", onclick: () => location.reload() }, "Try again");
      add(replace(main), [h("h1", {}, "facegate console"), h("p", { class: "problem", role: "alert" }, sentence(error)), h("div", { class: "actions" }, retry)]);
    }
  }
})();
