// Model: what decides. The served embedder and detector with their licenses and provenance, the
// embedder's thresholds per false-accept rate, and its accuracy and calibration curves drawn from
// its manifest (GET /models); what is running from /readyz.

import { call } from "./api.js";
import { h, replace } from "./dom.js";
import { lineChart } from "./chart.js";
import { number, oneIn, rate } from "./words.js";

function facts(pairs) {
  const list = h("dl", { class: "facts" });
  for (const [label, value] of pairs) {
    if (value === null || value === undefined || value === "") continue;
    list.append(h("dt", {}, label), h("dd", {}, typeof value === "object" && !(value instanceof Node) ? JSON.stringify(value) : value));
  }
  return list;
}

/** A URL from a manifest as a link when it is https, else as text. */
function link(url) {
  return /^https:\/\//.test(url || "") ? h("a", { href: url, rel: "noopener noreferrer" }, url) : url;
}

function licenseFacts(license) {
  return [
    ["License", license?.name],
    ["Terms", license?.terms],
    ["Holder", license?.holder],
    ["License text", license?.url ? link(license.url) : null],
  ];
}

/**
 * ROC points (FAR, TAR) the manifest's metrics hold: the evaluation set's, at the FARs its impostor
 * pairs can measure (LFW's 3,000 cannot tell 1e-4 from 1e-5), and the calibration's.
 */
function rocSeries(metrics) {
  const series = [];
  const evaluated = metrics.no_flip?.tar_at_far || metrics.tar_at_far;
  if (evaluated) {
    const impostors = Object.values(metrics.no_flip?.at_thresholds || {})[0]?.impostor_pairs;
    const measurable = Object.entries(evaluated).filter(([far]) => !impostors || Number(far) * impostors >= 1);
    const name = `${(metrics.set || "evaluation").toUpperCase()} pairs` + (impostors ? ` (${impostors.toLocaleString("en-US")} impostor pairs)` : "");
    series.push({ name, points: measurable.map(([far, tar]) => [Number(far), Number(tar)]) });
  }
  const realized = metrics.calibration?.realized;
  if (realized) {
    series.push({ name: "calibration (other people)", points: Object.values(realized).map((r) => [Number(r.far), Number(r.tar)]) });
  }
  return series.filter((one) => one.points.length >= 2);
}

/** Why the calibration's TAR sits below the evaluation's: what each counted, from the manifest. */
function calibrationContext(metrics) {
  const c = metrics.calibration;
  if (!c?.realized || !c.genuine_pairs) return null;
  const count = (n) => Number(n).toLocaleString("en-US");
  const evaluated = metrics.no_flip?.pairs ? `${count(metrics.no_flip.pairs)} chosen test pairs` : "its chosen test pairs";
  return h(
    "p",
    { class: "note" },
    `The calibration counts every same-person pair of its ${count(c.identities)} people (${count(c.genuine_pairs)} pairs, the hard ones included), ` +
      `where ${(metrics.set || "the evaluation set").toUpperCase()} scores ${evaluated}: the calibration's lower TAR is the one to expect across a gallery, ` +
      "and its false-accept rates are the ones the thresholds above are set by.",
  );
}

function table(head, rows) {
  return h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c)))))));
}

export async function render(main) {
  const [models, ready] = await Promise.all([call("GET", "models"), call("GET", "readyz").catch((error) => ({ problems: [{ error: error.message }] }))]);
  const embedder = models.embedder;
  const detector = models.detector;
  const sections = [h("h1", { tabindex: "-1" }, "Model")];
  for (const problem of ready.problems || []) {
    const which = [problem.model, problem.name].filter(Boolean).join(" ");
    sections.push(h("p", { class: "problem" }, which ? `${which}: ${problem.error}` : problem.error, problem.fix ? ` Fix: ${problem.fix}` : ""));
  }

  if (embedder) {
    const metrics = embedder.metrics || {};
    const accuracy = metrics.no_flip?.accuracy ?? metrics.accuracy;
    const running = ready.models?.embedder;
    sections.push(
      h(
        "section",
        { class: "panel", "aria-labelledby": "embedder-h" },
        h("h2", { id: "embedder-h" }, `Embedder: ${embedder.name} ${embedder.version}`),
        facts([
          ...licenseFacts(embedder.license),
          ["Architecture", embedder.provenance?.architecture],
          ["Author", embedder.provenance?.author],
          ["Trained on", embedder.provenance?.training_data],
          ["Embedding", `${embedder.embedding_dim} dimensions, ${embedder.alignment} alignment`],
          ["Accuracy", accuracy !== undefined ? `${(100 * accuracy).toFixed(2)}% on ${(metrics.set || "the evaluation set").toUpperCase()}${metrics.no_flip?.pairs ? ` (${metrics.no_flip.pairs.toLocaleString("en-US")} pairs)` : ""}` : null],
          ["Runs on", running ? running.providers.join(", ") : null],
          ["File sha256", h("code", {}, embedder.file.sha256)],
        ]),
      ),
    );
    const thresholds = Object.entries(embedder.thresholds || {}).sort((a, b) => Number(b[0]) - Number(a[0]));
    const thresholdPanel = h(
      "section",
      { class: "panel", "aria-labelledby": "thresholds-h" },
      h("h2", { id: "thresholds-h" }, "Thresholds"),
      h(
        "p",
        {},
        `/verify decides at FAR ${models.default_far} unless a request names another; /identify at FPIR ${models.default_fpir}: `,
        h("strong", {}, `${oneIn(models.default_fpir)} strangers would be matched at that setting`),
        ", whatever the gallery's size (the threshold rises as the gallery grows).",
      ),
    );
    if (thresholds.length) {
      thresholdPanel.append(
        table(
          ["False-accept rate", "In words", "Cosine threshold"],
          thresholds.map(([far, t]) => [far === models.default_far ? `${far} (default)` : far, `${oneIn(far)} impostor pairs accepted`, number(t, 4)]),
        ),
      );
    } else {
      thresholdPanel.append(h("p", { class: "problem" }, "This embedder has no calibrated thresholds: every decision needs an explicit threshold."));
    }
    const curve = embedder.far_curve?.points || thresholds.map(([far, t]) => [Number(far), t]);
    if (curve.length >= 2) {
      thresholdPanel.append(
        h("h3", {}, "Calibrated threshold by false-accept rate"),
        lineChart({ title: `${embedder.name}: cosine threshold for each false-accept rate`, x: { label: "false-accept rate (log scale)", log: true }, y: { label: "cosine threshold" }, series: [{ name: "threshold", points: curve }] }),
      );
    }
    sections.push(thresholdPanel);
    const roc = rocSeries(metrics);
    if (roc.length) {
      sections.push(
        h(
          "section",
          { class: "panel", "aria-labelledby": "roc-h" },
          h("h2", { id: "roc-h" }, "ROC: genuine pairs accepted at each false-accept rate"),
          h("p", { class: "note" }, "From the model card's figures in the manifest: the share of same-person pairs accepted (TAR) at each FAR, on the evaluation pairs and on the calibration set."),
          calibrationContext(metrics),
          lineChart({ title: `${embedder.name}: ROC`, x: { label: "false-accept rate (log scale)", log: true }, y: { label: "true-accept rate", min: 0, max: 1 }, series: roc }),
          table(["Set", "FAR", "In words", "TAR"], roc.flatMap((one) => one.points.map(([far, tar]) => [one.name, rate(far), `${oneIn(far)} impostor pairs`, `${(100 * tar).toFixed(1)}%`]))),
        ),
      );
    }
  } else {
    sections.push(h("p", { class: "problem" }, "No embedder is loaded: recognition answers 503 until one is (see the problems above)."));
  }
  if (detector) {
    sections.push(
      h(
        "section",
        { class: "panel", "aria-labelledby": "detector-h" },
        h("h2", { id: "detector-h" }, `Detector: ${detector.name} ${detector.version}`),
        facts([...licenseFacts(detector.license), ["Source", detector.provenance?.source], ["Paper", detector.provenance?.paper], ["File sha256", h("code", {}, detector.file.sha256)]]),
      ),
    );
  }
  if (ready.gallery) {
    const g = ready.gallery;
    sections.push(
      h(
        "section",
        { class: "panel", "aria-labelledby": "serving-h" },
        h("h2", { id: "serving-h" }, "Serving"),
        facts([
          ["Ready", ready.ready ? "yes" : `no (warm-up ${ready.warmup})`],
          ["Subjects", g.subjects],
          ["Faces", g.faces],
          ["Searchable faces", g.searchable_faces],
          ["Index", g.index ? `${g.index.backend || ""} ${g.index.size ?? ""}`.trim() : null],
        ]),
      ),
    );
  }
  replace(main, ...sections);
}
