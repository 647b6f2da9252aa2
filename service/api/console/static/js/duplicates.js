// Possible duplicates: pairs of subjects that identification would answer for each other (GET
// /gallery/duplicates), perhaps one person enrolled twice, each with links to both subjects and the
// FPIR they are flagged at in plain words; or one subject's pairs (#/duplicates?subject=ID:
// ?subject_id=), which a large gallery offers where it keeps no whole list. Names and ids are text.

import { ApiError, call, path, subjectsMatching } from "./api.js";
import { busy, confirmAction, field, flash, h, replace, say, statusLine } from "./dom.js";
import { faceThumb } from "./gallery.js";
import { number, oneIn, sentence } from "./words.js";

const FPIRS = ["0.1", "0.01", "0.001", "0.0001"];
const LIMIT = 100;
const MATCHES = 10; // subjects offered for a name that several share

function subjectCell(label, id, name) {
  return h("td", { "data-label": label }, h("a", { href: `#/gallery/${encodeURIComponent(id)}` }, name), h("span", { class: "meta" }, " id ", h("code", {}, id)));
}

/**
 * One click to merge a pair, keeping `keep` (after a confirmation): the other's faces move to it and
 * the other subject is deleted, in one transaction (POST /subjects/{id}/merge).
 */
function mergeButton(keep, drop, refresh, problem) {
  const button = h("button", { type: "button", class: "small quiet merge" }, `Merge, keeping “${keep.name}”`);
  button.addEventListener("click", async () => {
    const question = `Merge “${drop.name}” (${drop.id}) into “${keep.name}” (${keep.id})? Its faces move to “${keep.name}”, and “${drop.name}” is deleted.`;
    if (!(await confirmAction(question, "Merge"))) return;
    try {
      await call("POST", `${path("subjects", keep.id)}/merge`, { json: { subject_id: drop.id } });
      flash(`“${drop.name}” merged into “${keep.name}”: its faces are now “${keep.name}”'s.`);
      refresh(keep, drop);
    } catch (error) {
      replace(problem, sentence(error));
      problem.hidden = false;
    }
  });
  return button;
}

function mergeCell(pair, refresh, problem) {
  const one = { id: pair.subject_id, name: pair.name };
  const other = { id: pair.other_subject_id, name: pair.other_name };
  return h("td", { "data-label": "Merge" }, h("div", { class: "actions tight" }, mergeButton(one, other, refresh, problem), mergeButton(other, one, refresh, problem)));
}

/** The page's address for a subject (or every subject) at an FPIR (or the default). */
function address(subject, fpir) {
  const query = new URLSearchParams({ ...(subject ? { subject } : {}), ...(fpir ? { fpir } : {}) }).toString();
  return `#/duplicates${query ? `?${query}` : ""}`;
}

/**
 * Pick one subject by id or name: its id (an id asked directly, or the one subject of that name), or
 * nothing with the reason said in `status` (no such subject; several of that name, linked).
 */
async function pickSubject(typed, status, fpir) {
  try {
    return (await call("GET", path("subjects", typed))).id;
  } catch (error) {
    if (!(error instanceof ApiError && (error.status === 404 || error.status === 422))) throw error; // not an id: a name, perhaps
  }
  const needle = typed.toLowerCase();
  const named = [];
  for await (const subject of subjectsMatching(typed)) {
    if (subject.name.toLowerCase() === needle) named.push(subject);
  }
  if (named.length === 1) return named[0].id;
  if (!named.length) {
    say(status, "problem", `No subject has the id or the name “${typed}”.`);
    return null;
  }
  const links = named.slice(0, MATCHES).map((s) => h("li", {}, h("a", { href: address(s.id, fpir) }, s.name), h("span", { class: "meta" }, " id ", h("code", {}, s.id))));
  say(status, "problem", `${named.length} subjects are named “${typed}”: pick one.`, h("ul", {}, links));
  return null;
}

/** The form that shows one subject's pairs: an id or a name, looked up when sent. */
function subjectForm(subject, fpir) {
  const status = statusLine();
  const form = h(
    "form",
    { class: "row", "aria-label": "One subject's pairs" },
    field("Subject", { name: "subject", value: subject || "", required: true, autocomplete: "off" }, "its id or name: its faces are searched against every face"),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Show its pairs")),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const typed = form.elements.subject.value.trim();
    say(status, "busy", `Looking up “${typed}”…`);
    const id = await busy(form, () => pickSubject(typed, status, fpir).catch((error) => say(status, "problem", sentence(error))));
    if (typeof id === "string") location.hash = address(id, fpir);
  });
  return h("div", {}, form, status);
}

const LEAD =
  "Subjects that identification would answer for each other: perhaps one person enrolled under two ids. Merge such a pair (its faces move to one subject, the other is deleted): besides the wrong answers, such pairs make identification stricter for everyone.";

/** A gallery that keeps no whole list (from 50,000 faces the service scores a sample): why, and one subject at a time instead. */
function renderPerSubjectOnly(main, error, fpir) {
  replace(
    main,
    h("h1", { tabindex: "-1" }, "Possible duplicates"),
    h("p", { class: "lead" }, LEAD),
    h(
      "section",
      { class: "panel", "aria-label": "Pairs" },
      h(
        "p",
        { class: "status busy", role: "status", id: "per-subject-only" },
        "This gallery is too large for the whole list at once: to keep identification fast, the service scores a sample of its faces against the others, not every face, " +
          "and listing every pair would search every face against every other (about an hour of CPU at a million faces: ",
        h("code", {}, "facegate gallery duplicates"),
        " does it on the server). Pick a subject instead: its faces are searched against every face while you wait.",
      ),
      h("p", { class: "note" }, `The service says: ${sentence(error)}`),
      subjectForm(null, fpir),
    ),
  );
}

export async function render(main, { params, refresh }) {
  const asked = params.get("fpir");
  const subject = params.get("subject");
  const query = { limit: LIMIT, ...(asked ? { fpir: asked } : {}), ...(subject ? { subject_id: subject } : {}) };
  let answer;
  let named;
  try {
    [answer, named] = await Promise.all([call("GET", "gallery/duplicates", { query }), subject ? call("GET", path("subjects", subject)) : null]);
  } catch (error) {
    if (subject || !(error instanceof ApiError && error.code === "duplicates_unavailable")) throw error;
    renderPerSubjectOnly(main, error, asked);
    return;
  }
  const fpir = field("Strangers matched (FPIR)", { name: "fpir" }, "pairs are flagged where identification at this setting would answer one subject for the other", "select");
  const choices = FPIRS.includes(String(answer.fpir)) ? FPIRS : [...FPIRS, String(answer.fpir)];
  fpir.querySelector("select").append(
    ...choices.map((value) => h("option", { value, selected: Number(value) === answer.fpir }, `${oneIn(value)} (${Number(value).toExponential(0)})`)),
  );
  const form = h("form", { class: "row" }, fpir, h("div", { class: "actions" }, h("button", { type: "submit" }, "Show")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = address(subject, form.elements.fpir.value);
  });
  // A merge that deleted the subject shown goes on with the one it was merged into.
  const merged = (keep, drop) => {
    if (subject && drop.id === subject) location.hash = address(keep.id, asked);
    else refresh();
  };
  const scale = answer.score === "margin" ? "margin score" : "cosine similarity";
  const decision = h(
    "p",
    { class: "decision note" },
    `Flagged at an FPIR of ${answer.fpir} (${oneIn(answer.fpir)} strangers would be matched): a face is listed when its ${scale} ` +
      `against the other subjects reaches ${number(answer.threshold, 4)}, in a gallery of ${answer.subjects.toLocaleString("en-US")} ` +
      `${answer.subjects === 1 ? "subject" : "subjects"} and ${answer.faces.toLocaleString("en-US")} ${answer.faces === 1 ? "face" : "faces"}.`,
  );
  let listing;
  const problem = h("p", { class: "status problem", role: "alert", hidden: true });
  if (!answer.pairs.length) {
    const none = subject
      ? `No possible duplicates of “${named.name}” at this setting: identification would answer none of its faces as another subject.`
      : "No possible duplicates at this setting: identification would answer no enrolled face as another subject.";
    listing = h("p", { class: "status ok", role: "status" }, none);
  } else {
    const thumbs = await Promise.all(answer.pairs.map((p) => faceThumb({ face_id: p.face_id })));
    const rows = answer.pairs.map((p, i) =>
      h(
        "tr",
        { "data-face": p.face_id },
        subjectCell("Subject", p.subject_id, p.name),
        subjectCell("Would be identified as", p.other_subject_id, p.other_name),
        h("td", { "data-label": "Face", class: "face" }, thumbs[i].element, h("span", { class: "meta" }, `Face ${p.face_id}`)),
        h("td", { "data-label": "Similarity" }, number(p.similarity)),
        h("td", { "data-label": answer.score === "margin" ? "Margin score" : "Score" }, number(p.score, 4)),
        mergeCell(p, merged, problem),
      ),
    );
    const shown = answer.total > answer.pairs.length ? `The ${answer.pairs.length} highest of ${answer.total} pairs.` : `${answer.total} ${answer.total === 1 ? "pair" : "pairs"}.`;
    listing = h(
      "div",
      {},
      h("p", { class: "status ok", role: "status" }, shown),
      h(
        "div",
        { class: "scroll" },
        h(
          "table",
          { class: "duplicates" },
          h("caption", { class: "note" }, "Each pair once, by the face that scores highest against the other subject"),
          h("thead", {}, h("tr", {}, ...["Subject", "Would be identified as", "Face", "Similarity", answer.score === "margin" ? "Margin score" : "Score", "Merge"].map((t) => h("th", { scope: "col" }, t)))),
          h("tbody", {}, rows),
        ),
      ),
    );
  }
  const scope = subject
    ? h(
        "p",
        { class: "scope" },
        "The pairs of ",
        h("a", { href: `#/gallery/${encodeURIComponent(named.id)}` }, named.name),
        h("span", { class: "meta" }, " id ", h("code", {}, named.id)),
        ": each of its faces searched against every face of the gallery. A pair in which another subject's faces would be answered as this one is listed on that subject's pairs. ",
        h("a", { href: address(null, asked) }, "All subjects' pairs"),
      )
    : null;
  replace(
    main,
    h("h1", { tabindex: "-1" }, subject ? `Possible duplicates of “${named.name}”` : "Possible duplicates"),
    h("p", { class: "lead" }, LEAD),
    h("section", { class: "panel", "aria-label": "Pairs" }, scope, form, decision, problem, listing),
    h("section", { class: "panel", "aria-label": "One subject's pairs" }, h("h2", {}, "One subject's pairs"), subjectForm(subject, asked)),
  );
}
