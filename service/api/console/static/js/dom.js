// Building the page from elements and text nodes only. Names, ids and metadata are user input: they
// reach the page as text (strings become Text nodes), never as markup; nothing here parses HTML.

/** An element: h("a", {href: "#/gallery", class: "x", onclick: fn}, "text", child, [more]). */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "value") el.value = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  add(el, children);
  return el;
}

/** Append strings (as text) and nodes; null, undefined and false are skipped. */
export function add(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return add(el, children);
}

/** A live region for a form's outcome: say(el, "busy" | "ok" | "problem", text). */
export function statusLine() {
  return h("p", { class: "status", role: "status", "aria-live": "polite" });
}

export function say(el, kind, ...text) {
  el.className = `status ${kind}`;
  replace(el, ...text);
}

/** A labelled input: field("Name", {name: "name", required: true}, "hint"). */
export function field(label, props = {}, hint = null, tag = "input") {
  const id = props.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  const control = h(tag, { ...props, id, "aria-describedby": hint ? `${id}-hint` : null });
  return h("div", { class: "field" }, h("label", { for: id }, label), hint && h("span", { class: "hint", id: `${id}-hint` }, hint), control);
}

/** Disable a form's buttons while `work` runs. */
export async function busy(form, work) {
  const buttons = [...form.querySelectorAll("button")];
  buttons.forEach((b) => (b.disabled = true));
  try {
    return await work();
  } finally {
    buttons.forEach((b) => (b.disabled = false));
  }
}

/** The modal confirmation dialog of index.html: resolves true when the operator confirms. */
export function confirmAction(question, action = "Delete") {
  const dialog = document.getElementById("confirm");
  replace(document.getElementById("confirm-text"), question);
  const ok = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  ok.textContent = action;
  return new Promise((resolve) => {
    const done = (answer) => {
      ok.removeEventListener("click", yes);
      cancel.removeEventListener("click", no);
      dialog.removeEventListener("cancel", no);
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    const yes = () => done(true);
    const no = () => done(false);
    ok.addEventListener("click", yes);
    cancel.addEventListener("click", no);
    dialog.addEventListener("cancel", no);
    dialog.showModal();
    cancel.focus();
  });
}

let flashed = null;
/** A message for the next page (after a delete that leaves the page): main.js shows it under the heading. */
export function flash(text) {
  flashed = text;
}

export function takeFlash() {
  const text = flashed;
  flashed = null;
  return text;
}

export function when(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}
