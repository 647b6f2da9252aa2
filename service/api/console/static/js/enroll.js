// Enroll: photos dropped, chosen or taken with the camera, enrolled under a new or an existing
// subject; each photo's detected face, or why it was refused (the quality gate's own words, and the
// face it saw).

import { ApiError, call, formData, path } from "./api.js";
import { busy, field, h, replace, say, statusLine } from "./dom.js";
import { cameraPanel, dropZone, faceCrop, photoWithBoxes, pickedList } from "./images.js";
import { sentence, why } from "./words.js";

const BULK = 20; // FACEGATE_MAX_BULK_IMAGES' default: larger selections go in several requests

function choice(name, value, label, checked) {
  const id = `${name}-${value}`;
  return h("label", { class: "choice", for: id }, h("input", { type: "radio", name, value, id, checked }), label);
}

export async function render(main, { rest }) {
  const preset = rest[0] || null;
  let files = [];
  const status = statusLine();
  const results = h("div", { "aria-live": "polite" });
  const picked = h("div");
  const showPicked = () => replace(picked, files.length ? pickedList(files, (i) => ((files = files.filter((_, j) => j !== i)), showPicked())) : null);
  const addFiles = (more) => {
    files = files.concat(more);
    showPicked();
  };

  const newFields = h(
    "div",
    { class: "row" },
    field("Name", { name: "name", maxlength: 256, autocomplete: "off" }),
    field("Id", { name: "new_id", maxlength: 128, autocomplete: "off" }, "optional (a random one when empty)"),
  );
  const existingFields = h("div", { class: "row" }, field("Subject id", { name: "subject_id", maxlength: 128, autocomplete: "off", value: preset || "" }));
  const who = h(
    "fieldset",
    {},
    h("legend", {}, "Whose photos"),
    choice("who", "new", "A new subject", !preset),
    choice("who", "existing", "An existing subject", Boolean(preset)),
    newFields,
    existingFields,
  );
  const showWho = () => {
    const existing = form.elements.who.value === "existing";
    newFields.hidden = existing;
    existingFields.hidden = !existing;
  };
  const form = h(
    "form",
    {},
    who,
    dropZone("Photos of the person", addFiles, { multiple: true, id: "enroll-files" }),
    cameraPanel((file) => addFiles([file])),
    picked,
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Enroll")),
    status,
  );
  form.addEventListener("change", (event) => event.target.name === "who" && showWho());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!files.length) return say(status, "problem", "Pick at least one photo first.");
    replace(results); // the last enrollment's results are not this one's
    const subject = await busy(form, () => enroll(form, files, status, results));
    if (subject) {
      // More photos go to the same person: the form now names the subject just enrolled.
      files = [];
      showPicked();
      form.elements.who.value = "existing";
      form.elements.subject_id.value = subject.id;
      form.elements.name.value = "";
      form.elements.new_id.value = "";
      showWho();
    }
  });
  showWho();

  let intro = "Each photo enrolls its largest face. A quality gate refuses faces that are blurred, turned away or too small; the result says which and why.";
  if (preset) {
    try {
      const subject = await call("GET", path("subjects", preset));
      intro = `Adding faces to “${subject.name}”. ${intro}`;
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error;
    }
  }
  replace(main, h("h1", { tabindex: "-1" }, "Enroll"), h("p", { class: "lead" }, intro), h("section", { class: "panel" }, form), results);
}

/** The subject to enroll under, and whether it was created now (to be removed if no photo passes). */
async function subjectFor(form) {
  if (form.elements.who.value === "existing") {
    const id = form.elements.subject_id.value.trim();
    if (!id) throw new Error("Give the subject's id.");
    return { subject: await call("GET", path("subjects", id)), created: false };
  }
  const name = form.elements.name.value.trim();
  if (!name) throw new Error("Give the new subject's name.");
  const body = { name: form.elements.name.value };
  if (form.elements.new_id.value.trim()) body.id = form.elements.new_id.value.trim();
  return { subject: await call("POST", "subjects", { json: body }), created: true };
}

/** Enroll `files`; the subject when at least one was enrolled, else null (a subject made for them is deleted again). */
async function enroll(form, files, status, results) {
  let subject;
  let created;
  try {
    ({ subject, created } = await subjectFor(form));
  } catch (error) {
    say(status, "problem", sentence(error));
    return null;
  }
  say(status, "busy", `Enrolling ${files.length} ${files.length === 1 ? "photo" : "photos"} under “${subject.name}”…`);
  const outcomes = [];
  for (let start = 0; start < files.length; start += BULK) {
    const batch = files.slice(start, start + BULK);
    try {
      const answer = await call("POST", `${path("subjects", subject.id)}/faces`, { form: formData({ images: batch }) });
      answer.results.forEach((r) => outcomes.push({ file: batch[r.index], face: r.face, error: r.error }));
    } catch (error) {
      if (error instanceof ApiError && error.code === "enrollment_failed" && error.details) {
        error.details.forEach((d) => outcomes.push({ file: batch[d.index], error: { code: d.code, message: d.message } }));
      } else {
        batch.forEach((file) => outcomes.push({ file, error: { code: error.code, message: error.message } }));
      }
    }
  }
  const enrolled = outcomes.filter((o) => o.face).length;
  let removed = false;
  if (!enrolled && created) {
    // Every photo was refused: the subject made for them would stay empty.
    removed = await call("DELETE", path("subjects", subject.id)).then(() => true, () => false);
  }
  const list = h("ul", { class: "results", "aria-label": "Enrollment results" });
  for (const outcome of outcomes) list.append(await resultCard(outcome));
  const summary = removed
    ? h("p", {}, `No photo was enrolled, so the new subject “${subject.name}” was not kept.`)
    : h(
        "p",
        {},
        `${enrolled} of ${outcomes.length} ${outcomes.length === 1 ? "photo" : "photos"} enrolled under “`,
        h("a", { href: `#/gallery/${encodeURIComponent(subject.id)}` }, subject.name),
        "”.",
      );
  replace(results, h("h2", {}, "Results"), summary, list);
  say(status, enrolled ? "ok" : "problem", enrolled ? `${enrolled} enrolled. More photos now go to “${subject.name}”.` : "No photo was enrolled: see why below.");
  return enrolled > 0 ? subject : null;
}

async function resultCard({ file, face, error }) {
  if (face) {
    const crop = face.box ? await faceCrop(file, face.box, `Face ${face.face_id} as detected in ${file.name}`) : null;
    const duplicate = face.possible_duplicate_of;
    return h(
      "li",
      { class: "enrolled" },
      h(
        "div",
        { class: "result-head" },
        crop,
        h(
          "div",
          {},
          h("strong", {}, `Enrolled as face ${face.face_id}`),
          h("div", { class: "note" }, file.name),
          face.score !== null && h("div", { class: "note" }, `detection score ${Number(face.score).toFixed(2)}`),
        ),
      ),
      duplicate &&
        h(
          "p",
          { class: "problem" },
          "Possibly the same person as “",
          h("a", { href: `#/gallery/${encodeURIComponent(duplicate.subject_id)}` }, duplicate.name),
          "” (",
          h("code", {}, duplicate.subject_id),
          `, similarity ${Number(duplicate.similarity).toFixed(3)}): identify would answer with that subject for this photo. Check that one person is not enrolled twice.`,
        ),
      face.quality_warning &&
        h("p", { class: "problem" }, `Enrolled although the quality gate would refuse it: ${face.quality_warning}. A better photo makes a better template.`),
    );
  }
  let picture = null;
  if (["low_quality_face", "multiple_faces"].includes(error.code)) {
    picture = await seenFaces(file); // the faces the gate looked at
  }
  return h(
    "li",
    { class: "refused" },
    h("strong", {}, "Refused"),
    h("div", { class: "note" }, file.name),
    h("p", {}, why(error)),
    picture,
  );
}

/** The photo with every face the detector found, boxed with its score and size (via /embed). */
async function seenFaces(file) {
  try {
    const { faces } = await call("POST", "embed", { form: formData({ image: file }) });
    const boxes = faces.map(({ face }, i) => ({
      box: face.box,
      kind: "refused",
      label: `face ${i + 1}: score ${face.score.toFixed(2)}, ${Math.round(Math.min(face.box[2] - face.box[0], face.box[3] - face.box[1]))} px`,
    }));
    return photoWithBoxes(file, boxes, `${faces.length} ${faces.length === 1 ? "face" : "faces"} detected`);
  } catch {
    return photoWithBoxes(file, []);
  }
}
