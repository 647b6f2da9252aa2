// Possible duplicates: pairs of subjects that identification would answer for each other (GET
// /gallery/duplicates), perhaps one person enrolled twice, each with links to both subjects and the
// FPIR they are flagged at in plain words. Names and ids are text.

import { call, path } from "./api.js";
import { confirmAction, field, flash, h, replace } from "./dom.js";
import { faceThumb } from "./gallery.js";
import { number, oneIn, sentence } from "./words.js";

const FPIRS = ["0.1", "0.01", "0.001", "0.0001"];
const LIMIT = 100;

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
      refresh();
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

export async function render(main, { params, refresh }) {
  const asked = params.get("fpir");
  const answer = await call("GET", "gallery/duplicates", { query: { limit: LIMIT, ...(asked ? { fpir: asked } : {}) } });
  const fpir = field("Strangers matched (FPIR)", { name: "fpir" }, "pairs are flagged where identification at this setting would answer one subject for the other", "select");
  const choices = FPIRS.includes(String(answer.fpir)) ? FPIRS : [...FPIRS, String(answer.fpir)];
  fpir.querySelector("select").append(
    ...choices.map((value) => h("option", { value, selected: Number(value) === answer.fpir }, `${oneIn(value)} (${Number(value).toExponential(0)})`)),
  );
  const form = h("form", { class: "row" }, fpir, h("div", { class: "actions" }, h("button", { type: "submit" }, "Show")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = `#/duplicates?fpir=${encodeURIComponent(form.elements.fpir.value)}`;
  });

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
    listing = h("p", { class: "status ok", role: "status" }, "No possible duplicates at this setting: identification would answer no enrolled face as another subject.");
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
        mergeCell(p, refresh, problem),
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
  replace(
    main,
    h("h1", { tabindex: "-1" }, "Possible duplicates"),
    h(
      "p",
      { class: "lead" },
      "Subjects that identification would answer for each other: perhaps one person enrolled under two ids. Merge such a pair (its faces move to one subject, the other is deleted): besides the wrong answers, such pairs make identification stricter for everyone.",
    ),
    h("section", { class: "panel", "aria-label": "Pairs" }, form, decision, problem, listing),
  );
}
