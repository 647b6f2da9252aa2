// Possible duplicates: pairs of subjects that identification would answer for each other (GET
// /gallery/duplicates), perhaps one person enrolled twice, each with links to both subjects and the
// FPIR they are flagged at in plain words. Names and ids are text.

import { call } from "./api.js";
import { field, h, replace } from "./dom.js";
import { number, oneIn } from "./words.js";

const FPIRS = ["0.1", "0.01", "0.001", "0.0001"];
const LIMIT = 100;

function subjectCell(id, name) {
  return h("td", {}, h("a", { href: `#/gallery/${encodeURIComponent(id)}` }, name), h("span", { class: "meta" }, " id ", h("code", {}, id)));
}

export async function render(main, { params }) {
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
  if (!answer.pairs.length) {
    listing = h("p", { class: "status ok", role: "status" }, "No possible duplicates at this setting: identification would answer no enrolled face as another subject.");
  } else {
    const rows = answer.pairs.map((p) =>
      h(
        "tr",
        { "data-face": p.face_id },
        subjectCell(p.subject_id, p.name),
        subjectCell(p.other_subject_id, p.other_name),
        h("td", {}, `Face ${p.face_id}`),
        h("td", {}, number(p.similarity)),
        h("td", {}, number(p.score, 4)),
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
          h("thead", {}, h("tr", {}, ...["Subject", "Would be identified as", "Face", "Similarity", answer.score === "margin" ? "Margin score" : "Score"].map((t) => h("th", { scope: "col" }, t)))),
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
      "Subjects that identification would answer for each other: perhaps one person enrolled under two ids. Merge them (enroll the faces under one subject, delete the other): besides the wrong answers, such pairs make identification stricter for everyone.",
    ),
    h("section", { class: "panel", "aria-label": "Pairs" }, form, decision, listing),
  );
}
