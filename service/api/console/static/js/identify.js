// Identify: every face of a photo boxed and labelled with who it is (or "unknown"), the ranked
// candidates per face, and the decision's promise in plain words ("1 in 100 strangers would be
// matched at this setting").

import { call, formData } from "./api.js";
import { busy, field, h, replace, say, statusLine } from "./dom.js";
import { dropZone, photoWithBoxes } from "./images.js";
import { candidateScore, faceVerdict, identifyDecision, oneIn, sentence } from "./words.js";

const FPIRS = ["0.1", "0.01", "0.001", "0.0001"];

export async function render(main) {
  let photo = null;
  const status = statusLine();
  const result = h("div", { "aria-live": "polite" });
  const preview = h("div");
  const zone = dropZone("Photo to identify", async ([file]) => {
    photo = file;
    replace(preview, await photoWithBoxes(file, [], file.name));
  }, { id: "identify-file" });
  const models = await call("GET", "models");
  const fpir = field("Strangers matched (FPIR)", { name: "fpir" }, "the share of people who are not enrolled that would be matched to someone", "select");
  fpir.querySelector("select").append(
    ...FPIRS.map((value) => h("option", { value, selected: Number(value) === models.default_fpir }, `${oneIn(value)} (${Number(value).toExponential(0)})`)),
  );
  const topK = field("Candidates per face", { name: "top_k", type: "number", min: 1, max: 20, value: "3" });
  const form = h("form", {}, zone, preview, h("div", { class: "row" }, fpir, topK), h("div", { class: "actions" }, h("button", { type: "submit" }, "Identify")), status);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!photo) return say(status, "problem", "Pick a photo first.");
    await busy(form, async () => {
      say(status, "busy", "Searching the gallery…");
      try {
        const answer = await call("POST", "identify", {
          form: formData({ image: photo, faces: "all", fpir: form.elements.fpir.value, top_k: form.elements.top_k.value }),
        });
        say(status, "ok", "Done.");
        replace(result, await report(answer, photo));
      } catch (error) {
        say(status, "problem", sentence(error));
        replace(result);
      }
    });
  });
  replace(
    main,
    h("h1", { tabindex: "-1" }, "Identify"),
    h("p", { class: "lead" }, "Who is in this photo? Every face is searched in the gallery."),
    h("section", { class: "panel" }, form),
    result,
  );
}

async function report(answer, photo) {
  const results = answer.results || [answer];
  const decision = identifyDecision(answer);
  const label = (r, i) => `${i + 1} · ${r.match ? r.match.name : "unknown"}`;
  const figure = await photoWithBoxes(
    photo,
    results.map((r, i) => ({ box: r.face?.box, label: label(r, i), kind: r.match ? "known" : "" })),
    `${results.length} ${results.length === 1 ? "face" : "faces"}`,
  );
  const faces = h("ol", { class: "faceresults", "aria-label": "Faces" });
  results.forEach((r, i) => {
    const candidates = h("ol", { class: "candidates" });
    for (const c of r.candidates) {
      const isMatch = r.match && r.match.subject_id === c.subject_id;
      candidates.append(
        h(
          "li",
          {},
          h("a", { href: `#/gallery/${encodeURIComponent(c.subject_id)}` }, c.name),
          ` (${c.subject_id}) ${candidateScore(c, answer)}`,
          isMatch && h("span", { class: "tag" }, "match"),
        ),
      );
    }
    faces.append(
      h(
        "li",
        {},
        h("h3", {}, `Face ${i + 1}`),
        h("p", { class: `verdict ${r.match ? "yes" : "unknown"}` }, r.match ? `✓ ${r.match.name}` : "Unknown: not in the gallery"),
        faceVerdict(r, answer) && h("p", { class: "note" }, faceVerdict(r, answer)),
        r.candidates.length ? h("div", {}, h("span", { class: "note" }, "Ranked candidates:"), candidates) : h("p", { class: "note" }, "The gallery is empty."),
      ),
    );
  });
  return h(
    "section",
    { class: "panel", "aria-labelledby": "identified" },
    h("h2", { id: "identified" }, `${results.filter((r) => r.match).length} of ${results.length} ${results.length === 1 ? "face" : "faces"} recognized`),
    h("p", { class: "decision lead" }, h("strong", {}, decision.promise)),
    h("p", { class: "note" }, decision.detail),
    figure,
    faces,
    h("p", { class: "note" }, `Model ${answer.model.name} ${answer.model.version}.`),
  );
}
