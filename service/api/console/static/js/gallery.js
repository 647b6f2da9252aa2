// Gallery: subjects with search and paging, a subject's faces (thumbnails where the service keeps
// chips), its name and metadata, and the deletes. Every name, id and metadata value is text.

import { ApiError, call, path } from "./api.js";
import { busy, confirmAction, field, flash, h, replace, say, statusLine, when } from "./dom.js";
import { objectUrl } from "./images.js";
import { sentence } from "./words.js";

const PAGE = 25;
const MAX_MATCHES = 200;

function subjectItem(subject, select = null) {
  return h(
    "li",
    { "data-subject": subject.id },
    select,
    h("a", { href: `#/gallery/${encodeURIComponent(subject.id)}` }, subject.name),
    h("span", { class: "meta" }, "id ", h("code", {}, subject.id)),
    h("span", { class: "meta" }, `${subject.face_count} ${subject.face_count === 1 ? "face" : "faces"}`),
  );
}

/** The subject's first face as a thumbnail at the head of its row (after the page is shown: it costs two calls). */
async function rowThumb(item, subject) {
  if (!subject.face_count) return;
  try {
    const { faces } = await call("GET", `${path("subjects", subject.id)}/faces`);
    const thumb = faces.length ? await faceThumb(faces[0]) : null;
    const pick = item.querySelector("span.pick");
    if (thumb?.stored) (pick ? pick.after(thumb.element) : item.prepend(thumb.element));
  } catch {
    // a subject deleted meanwhile, or a failed call: the row stays without a thumbnail
  }
}

/** Checkboxes on a page of subjects and a button that deletes those ticked, after one confirmation. */
function bulkDelete(subjects, refresh, status) {
  const ticked = new Set();
  const button = h("button", { type: "button", class: "danger", disabled: true }, "Delete selected");
  const boxes = subjects.map((subject) => {
    const id = `pick-${subjects.indexOf(subject)}`;
    const box = h("input", { type: "checkbox", id, class: "pick" });
    box.addEventListener("change", () => {
      if (box.checked) ticked.add(subject);
      else ticked.delete(subject);
      button.disabled = ticked.size === 0;
      button.textContent = ticked.size ? `Delete ${ticked.size} selected` : "Delete selected";
    });
    return h("span", { class: "pick" }, box, h("label", { for: id, class: "visually-hidden" }, `Select “${subject.name}”`));
  });
  button.addEventListener("click", async () => {
    const chosen = [...ticked];
    const faces = chosen.reduce((n, s) => n + s.face_count, 0);
    const names = chosen.map((s) => `“${s.name}”`).join(", ");
    if (!(await confirmAction(`Delete ${chosen.length} ${chosen.length === 1 ? "subject" : "subjects"} (${names}) and their ${faces} ${faces === 1 ? "face" : "faces"}? This cannot be undone.`))) return;
    const failed = [];
    for (const subject of chosen) {
      await call("DELETE", path("subjects", subject.id)).catch((error) => failed.push(`“${subject.name}”: ${sentence(error)}`));
    }
    const done = chosen.length - failed.length;
    if (failed.length) return say(status, "problem", `${done} deleted; not deleted: ${failed.join(" ")}`);
    flash(`${done} ${done === 1 ? "subject" : "subjects"} and their faces deleted.`);
    refresh();
  });
  return { boxes, actions: h("div", { class: "actions" }, button) };
}

export async function renderList(main, { params, refresh }) {
  const query = (params.get("q") || "").trim();
  const offset = Math.max(0, Number.parseInt(params.get("offset") || "0", 10) || 0);
  const status = statusLine();
  const search = field("Search subjects", { name: "q", type: "search", value: query, autocomplete: "off" }, "by name or id, across the whole gallery");
  const searchForm = h(
    "form",
    { role: "search", class: "row" },
    search,
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Search"), query && h("a", { href: "#/gallery" }, "Show all")),
  );
  searchForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const q = searchForm.elements.q.value.trim();
    location.hash = q ? `#/gallery?q=${encodeURIComponent(q)}` : "#/gallery";
  });
  const list = h("ul", { class: "subjects", "aria-label": "Subjects" });
  const pager = h("div", { class: "pager" });
  replace(
    main,
    h("h1", { tabindex: "-1" }, "Gallery"),
    h("section", { class: "panel", "aria-label": "Subjects" }, searchForm, status, list, pager),
    newSubjectPanel(),
  );
  say(status, "busy", "Loading subjects…");
  if (query) {
    const page = await call("GET", "subjects", { query: { limit: MAX_MATCHES, search: query } });
    for (const subject of page.subjects) list.append(subjectItem(subject));
    const found = page.total;
    const shown = found > page.subjects.length ? ` (the first ${page.subjects.length} shown: narrow the search)` : "";
    say(status, "ok", `${found.toLocaleString("en-US")} ${found === 1 ? "subject matches" : "subjects match"} “${query}”${shown}.`);
    return;
  }
  const page = await call("GET", "subjects", { query: { limit: PAGE, offset } });
  const bulk = bulkDelete(page.subjects, refresh, status);
  page.subjects.forEach((s, i) => {
    const item = subjectItem(s, bulk.boxes[i]);
    list.append(item);
    rowThumb(item, s);
  });
  if (page.subjects.length) pager.before(bulk.actions);
  if (page.total === 0) {
    say(status, "ok", "The gallery is empty: create a subject below, or enroll photos.");
  } else if (page.subjects.length === 0) {
    say(status, "ok", `No subjects from ${offset + 1}: the gallery holds ${page.total}.`);
  } else {
    say(status, "ok", `Subjects ${offset + 1}–${offset + page.subjects.length} of ${page.total}.`);
  }
  if (offset > 0) pager.append(h("a", { href: `#/gallery?offset=${Math.max(0, offset - PAGE)}` }, "← Previous page"));
  if (page.next_offset !== null) pager.append(h("a", { href: `#/gallery?offset=${page.next_offset}` }, "Next page →"));
}

/** Metadata typed as JSON: an object, or an error message. */
export function parseMetadata(text) {
  if (!text.trim()) return { value: {} };
  try {
    const value = JSON.parse(text);
    if (value === null || typeof value !== "object" || Array.isArray(value)) return { error: "Metadata is a JSON object, e.g. {\"department\": \"R&D\"}." };
    return { value };
  } catch (error) {
    return { error: `Metadata is not valid JSON: ${error.message}` };
  }
}

function newSubjectPanel() {
  const status = statusLine();
  const form = h(
    "form",
    {},
    h("div", { class: "row" }, field("Name", { name: "name", required: true, maxlength: 256, autocomplete: "off" }), field("Id", { name: "id", maxlength: 128, autocomplete: "off", pattern: "[A-Za-z0-9][A-Za-z0-9_.:@\\-]{0,127}" }, "optional: letters, digits and _ . : @ - (a random one when empty)")),
    field("Metadata", { name: "metadata", rows: 3, placeholder: '{"department": "R&D"}' }, "optional: a JSON object", "textarea"),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Create subject")),
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const metadata = parseMetadata(form.elements.metadata.value);
    if (metadata.error) return say(status, "problem", metadata.error);
    const body = { name: form.elements.name.value, metadata: metadata.value };
    if (form.elements.id.value.trim()) body.id = form.elements.id.value.trim();
    await busy(form, async () => {
      try {
        const created = await call("POST", "subjects", { json: body });
        location.hash = `#/gallery/${encodeURIComponent(created.id)}`;
      } catch (error) {
        say(status, "problem", sentence(error));
      }
    });
  });
  return h("section", { class: "panel", "aria-labelledby": "new-subject" }, h("h2", { id: "new-subject" }, "New subject"), form);
}

/** A face's thumbnail from the chip the service keeps, or a note saying why there is none. */
export async function faceThumb(face) {
  try {
    const png = await call("GET", `faces/${face.face_id}/chip`, { blob: true });
    return { element: h("img", { class: "thumb chip", src: objectUrl(png), alt: `Face ${face.face_id}` }), stored: true };
  } catch (error) {
    if (error instanceof ApiError && error.code === "face_chip_not_stored") {
      return { element: h("div", { class: "thumb" }, "No image kept"), stored: false };
    }
    return { element: h("div", { class: "thumb" }, `Image unavailable: ${error.message}`), stored: true };
  }
}

export async function renderSubject(main, { rest, refresh }) {
  const id = rest[0];
  const [subject, { faces }] = await Promise.all([call("GET", path("subjects", id)), call("GET", `${path("subjects", id)}/faces`)]);
  const status = statusLine();
  const heading = h("h1", { tabindex: "-1" }, subject.name);
  const facts = h(
    "dl",
    { class: "facts" },
    h("dt", {}, "Id"),
    h("dd", {}, h("code", {}, subject.id)),
    h("dt", {}, "Faces"),
    h("dd", {}, String(subject.face_count)),
    h("dt", {}, "Created"),
    h("dd", {}, when(subject.created)),
    h("dt", {}, "Updated"),
    h("dd", {}, when(subject.updated)),
  );

  const renameForm = h(
    "form",
    { class: "row" },
    field("Name", { name: "name", required: true, maxlength: 256, value: subject.name, autocomplete: "off" }),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Rename")),
  );
  renameForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    await busy(renameForm, async () => {
      try {
        const updated = await call("PATCH", path("subjects", id), { json: { name: renameForm.elements.name.value } });
        heading.textContent = updated.name;
        say(status, "ok", "Renamed to “", updated.name, "”.");
      } catch (error) {
        say(status, "problem", sentence(error));
      }
    });
  });

  const metadataForm = h(
    "form",
    {},
    subject.metadata_withheld && h("p", { class: "problem" }, subject.metadata_withheld),
    field("Metadata (JSON)", { name: "metadata", rows: 5, value: JSON.stringify(subject.metadata, null, 2) }, "a JSON object; saving replaces it", "textarea"),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Save metadata")),
  );
  metadataForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const metadata = parseMetadata(metadataForm.elements.metadata.value);
    if (metadata.error) return say(status, "problem", metadata.error);
    await busy(metadataForm, async () => {
      try {
        await call("PATCH", path("subjects", id), { json: { metadata: metadata.value } });
        say(status, "ok", "Metadata saved.");
      } catch (error) {
        say(status, "problem", sentence(error));
      }
    });
  });

  const faceList = h("ul", { class: "faces", "aria-label": "Enrolled faces" });
  const chipNote = h("p", { class: "note" });
  const thumbs = await Promise.all(faces.map(faceThumb));
  faces.forEach((face, i) => {
    const remove = h("button", { type: "button", class: "danger small" }, `Delete face ${face.face_id}`);
    remove.addEventListener("click", async () => {
      if (!(await confirmAction(`Delete face ${face.face_id} of “${subject.name}”? Its embedding is removed from the gallery and the search index.`))) return;
      try {
        await call("DELETE", `faces/${face.face_id}`);
        flash(`Face ${face.face_id} deleted.`);
        refresh();
      } catch (error) {
        say(status, "problem", sentence(error));
      }
    });
    faceList.append(
      h(
        "li",
        { "data-face": face.face_id },
        thumbs[i].element,
        h("span", {}, `Face ${face.face_id}`),
        h("span", { class: "meta" }, face.score === null ? "aligned upload" : `detection score ${Number(face.score).toFixed(2)}`),
        h("span", { class: "meta" }, face.searchable ? `model ${face.model}` : `model ${face.model}: not searched until re-embedded`),
        h("span", { class: "meta" }, when(face.created)),
        remove,
      ),
    );
  });
  if (thumbs.some((t) => !t.stored)) {
    replace(
      chipNote,
      "Faces without a thumbnail were enrolled while the service kept no face images. Start it with ",
      h("code", {}, "FACEGATE_STORE_CROPS=true"),
      " to keep a 320×320 image of each face enrolled from then on (biometric data; it also lets ",
      h("code", {}, "facegate gallery reembed"),
      " re-embed after a model change).",
    );
  }

  const deleteSubject = h("button", { type: "button", class: "danger" }, "Delete subject");
  deleteSubject.addEventListener("click", async () => {
    if (!(await confirmAction(`Delete “${subject.name}” and all ${subject.face_count} of its faces? This cannot be undone.`))) return;
    try {
      await call("DELETE", path("subjects", id));
      flash(`Subject “${subject.name}” and its faces deleted.`);
      location.hash = "#/gallery";
    } catch (error) {
      say(status, "problem", sentence(error));
    }
  });

  replace(
    main,
    h("p", {}, h("a", { href: "#/gallery" }, "← Gallery")),
    heading,
    status,
    h("section", { class: "panel", "aria-label": "Details" }, facts, renameForm),
    h(
      "section",
      { class: "panel", "aria-labelledby": "faces-h" },
      h("h2", { id: "faces-h" }, `Faces (${faces.length})`),
      faces.length ? faceList : h("p", { class: "note" }, "No face enrolled yet."),
      chipNote,
      h("div", { class: "actions" }, h("a", { href: `#/enroll/${encodeURIComponent(id)}` }, "Add faces to this subject →")),
    ),
    h("section", { class: "panel", "aria-labelledby": "metadata-h" }, h("h2", { id: "metadata-h" }, "Metadata"), metadataForm),
    h("section", { class: "panel", "aria-labelledby": "danger-h" }, h("h2", { id: "danger-h" }, "Delete"), h("p", {}, "Deleting a subject deletes its faces from the database and the search index."), deleteSubject),
  );
}
