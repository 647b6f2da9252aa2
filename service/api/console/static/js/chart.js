// A small line chart in SVG, drawn from numbers (the manifest's calibration and accuracy), with its
// data also given as a table by the caller: the chart is for the eye, the table for everyone.

const SVG = "http://www.w3.org/2000/svg";

function s(tag, attrs = {}, text = null) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== null) el.textContent = text;
  return el;
}

/**
 * lineChart({title, x: {label, log}, y: {label, min, max}, series: [{name, points: [[x, y], ...]}]}):
 * x on a log scale when `log` (FARs), decades labelled 1e-n.
 */
export function lineChart({ title, x, y, series }) {
  const W = 560, L = 58, R = 16, T = 12, PLOT = 236; // the plot spans T..T+PLOT; axis labels and the legend below it
  const bottom = T + PLOT;
  const H = bottom + 48 + 18 * series.length;
  const fx = x.log ? Math.log10 : (v) => v;
  const xs = series.flatMap((one) => one.points.map((p) => fx(p[0])));
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x.log) [x0, x1] = [Math.floor(x0), Math.ceil(x1)];
  if (x1 === x0) x1 = x0 + 1;
  const ys = series.flatMap((one) => one.points.map((p) => p[1]));
  const y0 = y.min ?? Math.min(...ys), y1 = y.max ?? Math.max(...ys);
  const px = (v) => L + ((fx(v) - x0) / (x1 - x0)) * (W - L - R);
  const py = (v) => T + (1 - (v - y0) / (y1 - y0 || 1)) * PLOT;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title });
  svg.append(s("title", {}, title));
  if (x.log) {
    for (let d = x0; d <= x1; d++) {
      const at = L + ((d - x0) / (x1 - x0)) * (W - L - R);
      svg.append(s("line", { x1: at, x2: at, y1: T, y2: bottom, class: "grid" }));
      svg.append(s("text", { x: at, y: bottom + 16, "text-anchor": "middle" }, `1e${d}`));
    }
  }
  for (let i = 0; i <= 4; i++) {
    const v = y0 + ((y1 - y0) * i) / 4;
    svg.append(s("line", { x1: L, x2: W - R, y1: py(v), y2: py(v), class: "grid" }));
    svg.append(s("text", { x: L - 6, y: py(v) + 4, "text-anchor": "end" }, v.toFixed(y1 - y0 < 0.5 ? 3 : 2)));
  }
  svg.append(s("line", { x1: L, x2: L, y1: T, y2: bottom, class: "axis" }));
  svg.append(s("line", { x1: L, x2: W - R, y1: bottom, y2: bottom, class: "axis" }));
  svg.append(s("text", { x: (L + W - R) / 2, y: bottom + 34, "text-anchor": "middle" }, x.label));
  svg.append(s("text", { x: 14, y: T + PLOT / 2, "text-anchor": "middle", transform: `rotate(-90 14 ${T + PLOT / 2})` }, y.label));
  series.forEach((one, i) => {
    const points = [...one.points].sort((a, b) => a[0] - b[0]);
    svg.append(s("polyline", { points: points.map(([a, b]) => `${px(a)},${py(b)}`).join(" "), class: `line s${i}` }));
    for (const [a, b] of points) svg.append(s("circle", { cx: px(a), cy: py(b), r: 3, class: `s${i}` }));
    const ly = bottom + 56 + i * 18;
    svg.append(s("rect", { x: L, y: ly - 6, width: 16, height: 4, class: `s${i}` }));
    svg.append(s("text", { x: L + 22, y: ly }, one.name));
  });
  return svg;
}
