// Verify: are two photos (or a photo and an enrolled subject) the same person? The answer, the
// similarity against the threshold, and what the false-accept rate means in plain words.

import { call, formData } from "./api.js";
import { busy, field, h, replace, say, statusLine } from "./dom.js";
import { dropZone, photoWithBoxes } from "./images.js";
import { number, oneIn, sentence, subjectThreshold, verifyDecision } from "./words.js";

/** A select of the FARs the served embedder has thresholds for (GET /models), the default chosen. */
async function farSelect() {
  const models = await call("GET", "models");
  const fars = Object.keys(models.embedder?.thresholds || {}).sort((a, b) => Number(b) - Number(a));
  const hint = "a smaller rate accepts fewer strangers, and turns away more genuine pairs";
  const select = field("False-accept rate (FAR)", { name: "far" }, hint, "select");
  select.querySelector("select").append(...fars.map((far) => h("option", { value: far, selected: far === models.default_far }, `${far} (${oneIn(far)})`)));
  return select;
}

/** The gallery's first subjects as choices for the subject field (a datalist: typing filters them by name or id). */
async function subjectChoices() {
  const list = h("datalist", { id: "verify-subjects" });
  const page = await call("GET", "subjects", { query: { limit: 1000 } });
  list.append(...page.subjects.map((s) => h("option", { value: s.id, label: `${s.name} (${s.face_count} ${s.face_count === 1 ? "face" : "faces"})` })));
  return list;
}

function slot(label, id, onPick) {
  const preview = h("div");
  const zone = dropZone(label, async ([file]) => {
    onPick(file);
    replace(preview, await photoWithBoxes(file, [], file.name));
  }, { id });
  return { element: h("div", {}, zone, preview), preview };
}

export async function render(main) {
  const picked = { image1: null, image2: null };
  const status = statusLine();
  const result = h("div", { "aria-live": "polite" });
  const first = slot("First photo", "verify-1", (f) => (picked.image1 = f));
  const second = slot("Second photo", "verify-2", (f) => (picked.image2 = f));
  const subjectField = field("Enrolled subject", { name: "subject_id", autocomplete: "off", list: "verify-subjects" }, "its id, or pick one as you type a name: the photo is compared with each of its enrolled faces");
  subjectField.append(await subjectChoices());
  const mode = h(
    "fieldset",
    {},
    h("legend", {}, "Compare the first photo with"),
    h("label", { class: "choice", for: "vs-photo" }, h("input", { type: "radio", name: "against", value: "photo", id: "vs-photo", checked: true }), "a second photo"),
    h("label", { class: "choice", for: "vs-subject" }, h("input", { type: "radio", name: "against", value: "subject", id: "vs-subject" }), "an enrolled subject"),
  );
  const far = await farSelect();
  const form = h("form", {}, mode, h("div", { class: "photos" }, first.element, second.element, subjectField), far, h("div", { class: "actions" }, h("button", { type: "submit" }, "Verify")), status);
  const showMode = () => {
    const bySubject = form.elements.against.value === "subject";
    second.element.hidden = bySubject;
    subjectField.hidden = !bySubject;
  };
  form.addEventListener("change", (event) => event.target.name === "against" && showMode());
  showMode();
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const bySubject = form.elements.against.value === "subject";
    const subjectId = form.elements.subject_id.value.trim();
    if (!picked.image1 || (bySubject ? !subjectId : !picked.image2)) {
      return say(status, "problem", bySubject ? "Pick the photo and give the subject's id." : "Pick both photos.");
    }
    await busy(form, async () => {
      say(status, "busy", "Comparing…");
      try {
        const fields = { image1: picked.image1, far: form.elements.far.value };
        if (bySubject) fields.subject_id = subjectId;
        else fields.image2 = picked.image2;
        const answer = await call("POST", "verify", { form: formData(fields) });
        say(status, "ok", "Done.");
        replace(result, await verdict(answer, picked, bySubject));
      } catch (error) {
        const which = { image1: "The first photo", image2: "The second photo" };
        const [, name, rest] = /^(image[12]): (.*)$/.exec(error.message || "") || [];
        say(status, "problem", name ? `${which[name]}: ${sentence({ message: rest })}` : sentence(error));
        replace(result);
      }
    });
  });
  replace(main, h("h1", { tabindex: "-1" }, "Verify"), h("p", { class: "lead" }, "Are two photos of the same person? Each photo's largest face is compared."), h("section", { class: "panel" }, form), result);
}

async function verdict(answer, picked, bySubject) {
  const photos = [await photoWithBoxes(picked.image1, [{ box: answer.faces[0]?.box, label: "compared face", kind: answer.match ? "known" : "" }], picked.image1.name)];
  if (!bySubject) photos.push(await photoWithBoxes(picked.image2, [{ box: answer.faces[1]?.box, label: "compared face", kind: answer.match ? "known" : "" }], picked.image2.name));
  const against = bySubject ? `${answer.template === "mean" ? "the mean of the faces of " : ""}subject ${answer.subject_id}` : "the second photo";
  return h(
    "section",
    { class: "panel", "aria-labelledby": "verdict" },
    h("h2", { id: "verdict", class: `verdict ${answer.match ? "yes" : "no"}` }, answer.match ? "✓ Match: the same person" : "✗ No match"),
    h(
      "p",
      {},
      `Similarity ${number(answer.similarity, 4)} with ${against}; the threshold at this setting is ${number(answer.threshold, 4)}, so this is ${answer.match ? "" : "not "}a match.${subjectThreshold(answer)}`,
    ),
    h("p", { class: "decision" }, verifyDecision(answer)),
    h("p", { class: "note" }, `Model ${answer.model.name} ${answer.model.version}.`),
    h("div", { class: "photos" }, photos),
  );
}
