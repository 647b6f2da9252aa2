// The public API, called with the key the operator typed. The key lives in this tab's
// sessionStorage only (gone when the tab closes), is sent in the X-API-Key header, and never goes
// into a URL, the page, or the console log.

const STORE = "facegate.console.key";
// The API is the folder above /console/, so a console behind a path prefix calls the same service.
const BASE = new URL("../", document.baseURI);

export class ApiError extends Error {
  constructor(status, code, message, details = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

export const key = {
  get: () => sessionStorage.getItem(STORE),
  set: (value) => sessionStorage.setItem(STORE, value),
  clear: () => sessionStorage.removeItem(STORE),
};

let onRefused = () => {};
/** What to do when the service refuses the key in the middle of a session (main.js: sign out). */
export function whenRefused(handler) {
  onRefused = handler;
}

/**
 * call("GET", "subjects", {query: {limit: 25}}); {json: {...}} or {form: FormData}; {blob: true} for
 * an image. Errors are ApiError with the service's code and message (docs/api.md, Errors).
 */
export async function call(method, path, { query = null, json = undefined, form = null, blob = false, signIn = false } = {}) {
  const url = new URL(path, BASE);
  for (const [name, value] of Object.entries(query || {})) url.searchParams.set(name, String(value));
  const headers = { Accept: blob ? "image/*" : "application/json" };
  const current = key.get();
  if (current) headers["X-API-Key"] = current;
  let body = null;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (form) {
    body = form; // multipart; the browser sets the boundary
  }
  let response;
  try {
    response = await fetch(url, { method, headers, body, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" });
  } catch (error) {
    throw new ApiError(0, "unreachable", `The service did not answer (${error.message}).`);
  }
  if (response.ok) {
    if (response.status === 204) return null;
    return blob ? response.blob() : response.json();
  }
  let error = null;
  try {
    error = (await response.json()).error;
  } catch {
    // not the service's JSON error (a proxy's page): the status says enough
  }
  const failure = new ApiError(
    response.status,
    error?.code || `http_${response.status}`,
    error?.message || `${response.status} ${response.statusText}`,
    error?.details || null,
  );
  if (response.status === 401 && !signIn) onRefused(failure);
  throw failure;
}

/** Multipart form data from named values: files and strings; null and undefined are left out. */
export function formData(fields) {
  const form = new FormData();
  for (const [name, value] of Object.entries(fields)) {
    for (const item of [value].flat()) {
      if (item === null || item === undefined || item === "") continue;
      if (item instanceof Blob) form.append(name, item, item.name || `${name}.jpg`);
      else form.append(name, String(item));
    }
  }
  return form;
}

/** The subjects whose name or id contains `text` in any case, found by the server through the whole gallery, page by page. */
export async function* subjectsMatching(text) {
  let offset = 0;
  while (offset !== null) {
    const page = await call("GET", "subjects", { query: { limit: 1000, offset, search: text } });
    yield* page.subjects;
    offset = page.next_offset;
  }
}

export const path = (...parts) => parts.map((p) => encodeURIComponent(p)).join("/");
