// Rates in plain words: 1e-3 → "1 in 1,000". A decision's promise is written out, never left as
// an exponent for the operator to decode.

/** "1 in 1,000" for 1e-3; two significant digits for rates that are not a power of ten. */
export function oneIn(rate) {
  const value = Number(rate);
  if (!(value > 0)) return "none";
  if (value >= 0.5) return `${Math.round(value * 100)} in 100`;
  const n = 1 / value;
  const digits = Math.floor(Math.log10(n)) + 1;
  const rounded = digits <= 2 ? Math.round(n) : Number(n.toPrecision(2));
  return `1 in ${rounded.toLocaleString("en-US")}`;
}

/** A rate as a short figure: 0.009998936814280476 → "1.0e-2", 0.001 → "1e-3". */
export function rate(value) {
  const n = Number(value);
  if (!(n > 0)) return String(value);
  const [mantissa, exponent] = n.toExponential(1).split("e");
  return `${mantissa.endsWith(".0") && Math.abs(Number(mantissa) - n / 10 ** Number(exponent)) < 1e-9 ? mantissa.slice(0, -2) : mantissa}e${exponent}`;
}

export function number(value, digits = 3) {
  return Number(value).toFixed(digits);
}

/** The plain-words promise of a /verify answer. */
export function verifyDecision(result) {
  if (result.far === null || result.far === undefined) {
    return `Decided at an explicit threshold of ${number(result.threshold, 4)}: no calibrated error rate stands behind it.`;
  }
  const against = result.subject_id ? "a photo of someone else compared with an enrolled subject" : "two photos of different people";
  return (
    `Decided at a false-accept rate (FAR) of ${result.far}: about ${oneIn(result.far)} comparisons of ` +
    `${against} would be wrongly accepted as a match at this setting.`
  );
}

/** The scale an /identify threshold applies to, in words (docs/api.md, "Scores and thresholds"). */
export function scaleOf(result) {
  return { cosine: "cosine similarity", "as-norm": "cohort-normalized (AS-norm) score", margin: "margin score" }[result.score] || result.score;
}

/** A candidate's number on the decision's own scale, the one its threshold applies to: a raw cosine
 * beside a margin score would read as below the threshold of a match (docs/console.md); a cosine says
 * what it is against when that is the mean of the subject's faces (a candidate's `template`). A
 * subject whose closest face says more than its mean is held as the mean's cosine of the same
 * stranger rate (its `score`): that number first, the face's own cosine beside it. */
export function candidateScore(candidate, result) {
  const against = candidate.template === "mean" ? " with the mean of their faces" : "";
  const cosine = `cosine similarity${against} ${number(candidate.similarity, 4)}`;
  if (candidate.score === undefined || candidate.score === null) return cosine;
  if (result.score !== "cosine") return `${scaleOf(result)} ${number(candidate.score, 4)}`;
  if (Math.abs(candidate.score - candidate.similarity) < 5e-7) return cosine;
  return `cosine similarity ${number(candidate.score, 4)} as a mean's (their closest face's own ${number(candidate.similarity, 4)})`;
}

/** One face's decision: its best candidate's number against the threshold, on one scale. */
export function faceVerdict(face, result) {
  const best = face.best_score;
  if (best === undefined || best === null) return null;
  const reaches = best >= result.threshold;
  return `Best candidate's ${scaleOf(result)} ${number(best, 4)} ${reaches ? "reaches" : "is below"} the threshold ${number(result.threshold, 4)}.`;
}

/** Why a subject's threshold is above the model's threshold for the same FAR. */
export function subjectThreshold(result) {
  const k = result.subject_faces;
  if (!k || k <= 1 || result.far === null || result.far === undefined) return "";
  if (result.template === "mean")
    return ` The subject has ${k} enrolled faces and their mean counts, held to the threshold at which a stranger's photo matches a subject of ${k} faces in only about ${oneIn(result.far)} comparisons.`;
  return ` The subject has ${k} enrolled faces and the best of them counts, so each face is held to a stricter threshold than a single pair at FAR ${result.far}: a stranger's photo still matches the subject in only about ${oneIn(result.far)} comparisons.`;
}

/** The plain-words promise of an /identify answer, and the details behind it. */
export function identifyDecision(result) {
  const scale = scaleOf(result);
  const threshold = `the best candidate's ${scale} must reach ${number(result.threshold, 4)}`;
  const faces = result.gallery_faces;
  const size = faces !== null && faces !== undefined ? `${faces.toLocaleString("en-US")} searchable ${faces === 1 ? "face" : "faces"}` : null;
  const margin = result.score === "margin" ? " A margin score is the cosine similarity plus half of its lead over the next subjects' mean cosine." : "";
  const extra = margin + (result.extrapolated ? " This threshold lies beyond the model's calibrated points (read from its fitted tail)." : "");
  if (result.fpir !== null && result.fpir !== undefined) {
    return {
      promise: `${oneIn(result.fpir)} strangers would be matched at this setting.`,
      detail: `Decided at a false-positive identification rate (FPIR) of ${result.fpir}: ${threshold}` + (size ? `, for a gallery of ${size}.` : ".") + extra,
    };
  }
  if (result.far !== null && result.far !== undefined && result.gallery_faces) {
    const strangers = 1 - Math.pow(1 - Number(result.far), result.gallery_faces);
    return {
      promise: `About ${oneIn(strangers)} strangers would be matched at this setting.`,
      detail: `Decided at a per-comparison FAR of ${result.far} (each of the ${size} is one comparison): ${threshold}.` + extra,
    };
  }
  return {
    promise: "No calibrated rate stands behind this decision.",
    detail: `Decided at an explicit threshold: ${threshold}.`,
  };
}

/** What an error code means for the person holding the photo. */
export const WHY = {
  low_quality_face: "The quality gate refused this face",
  no_face: "No face was found",
  multiple_faces: "More than one face was found",
  image_too_small: "The image is too small",
  image_too_large: "The image is too large",
  invalid_image: "The file is not an image the service can read",
  unsupported_media_type: "The service does not take this image format",
  too_many_faces: "Too many faces in one photo",
  model_unavailable: "The service's models are not ready",
};

/** A service message as a sentence: capitalized, ended with a full stop. */
export function sentence(error) {
  const text = String(error.message || error.code || "Something went wrong").trim();
  const first = text.charAt(0).toUpperCase() + text.slice(1);
  return /[.!?…)]$/.test(first) ? first : `${first}.`;
}

/** Why a photo was refused: the reason in words, then the service's own detail unless it only repeats the reason. */
export function why(error) {
  const reason = WHY[error.code];
  if (!reason) return sentence(error);
  const detail = String(error.message || "").trim();
  const [said, meant] = [detail.toLowerCase().replace(/[.]$/, ""), reason.toLowerCase()];
  if (!said || meant.startsWith(said)) return `${reason}.`;
  if (said.startsWith(meant)) return sentence({ message: detail }); // "no face was found in …" says it already
  return `${reason}: ${/[.!?…)]$/.test(detail) ? detail : `${detail}.`}`; // after a colon the detail goes on the sentence
}
