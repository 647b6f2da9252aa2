// Photos the operator picks: a drop zone with a file input (keyboard and phone friendly) and the
// camera; a photo shown with its faces boxed and labelled by elements over it (labels are text);
// a face cut out of the operator's own photo. Object URLs are revoked when the page changes.

import { add, h, replace } from "./dom.js";

const urls = new Set();
const cameras = new Set();

export function objectUrl(blob) {
  const url = URL.createObjectURL(blob);
  urls.add(url);
  return url;
}

/** Free every object URL the last page made and stop its camera (main.js, on each page change). */
export function releaseAll() {
  for (const url of urls) URL.revokeObjectURL(url);
  urls.clear();
  for (const stop of cameras) stop();
  cameras.clear();
}

/**
 * A drop zone: click, keyboard (its file input) or drag and drop. `onFiles(files)` gets the image
 * files picked; `multiple` allows several.
 */
export function dropZone(label, onFiles, { multiple = false, id } = {}) {
  const inputId = id || `drop-${Math.random().toString(36).slice(2, 9)}`;
  const input = h("input", { type: "file", id: inputId, accept: "image/*", multiple });
  const skipped = h("span", { class: "hint skipped", role: "status" });
  const zone = h(
    "div",
    { class: "drop" },
    h("label", { for: inputId }, label),
    h("span", { class: "hint" }, multiple ? "Drop photos here, or choose files" : "Drop a photo here, or choose a file"),
    input,
    skipped,
  );
  const take = (list) => {
    const all = [...list];
    const files = all.filter((f) => f.type.startsWith("image/") || f.type === "");
    const others = all.filter((f) => !files.includes(f)).map((f) => f.name);
    skipped.textContent = others.length ? `Not ${others.length === 1 ? "an image" : "images"}, so left out: ${others.join(", ")}.` : "";
    if (files.length) onFiles(multiple ? files : files.slice(0, 1));
  };
  input.addEventListener("change", () => {
    take(input.files);
    input.value = "";
  });
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    take(event.dataTransfer.files);
  });
  return zone;
}

/** Natural size of an image blob (EXIF orientation applied, as the service applies it). */
export async function imageSize(blob) {
  const bitmap = await createImageBitmap(blob);
  const size = { width: bitmap.width, height: bitmap.height };
  bitmap.close();
  return size;
}

/**
 * A photo with boxes: faces = [{box: [x1, y1, x2, y2], label, kind: "known" | "refused" | ""}].
 * Boxes are placed in percent of the image, so they follow it at any width.
 */
export async function photoWithBoxes(blob, faces = [], caption = null) {
  const { width, height } = await imageSize(blob);
  const img = h("img", { src: objectUrl(blob), alt: caption ? `Photo: ${caption}` : "The photo sent" });
  const frame = h("div", { class: "frame" }, img); // as wide as the image: the boxes' percentages are of it
  const figure = h("figure", { class: "photo" }, frame);
  for (const face of faces) {
    if (!face.box) continue;
    const [x1, y1, x2, y2] = face.box.map(Number);
    const box = h("div", { class: `box ${face.kind || ""}`.trim(), role: "img", "aria-label": face.label || "face" });
    box.style.left = `${(100 * Math.max(0, x1)) / width}%`;
    box.style.top = `${(100 * Math.max(0, y1)) / height}%`;
    box.style.width = `${(100 * (Math.min(width, x2) - Math.max(0, x1))) / width}%`;
    box.style.height = `${(100 * (Math.min(height, y2) - Math.max(0, y1))) / height}%`;
    if (y1 < height * 0.08) box.classList.add("below");
    if (x1 > width / 2) box.classList.add("right"); // its label runs leftwards, inside the photo
    if (face.label) {
      // "1 · name": on a phone only the number stays on the photo (the names are listed below it)
      const [head, ...rest] = face.label.split(" · ");
      box.append(h("span", { class: "label" }, head, rest.length ? h("span", { class: "rest" }, ` · ${rest.join(" · ")}`) : null));
    }
    frame.append(box);
  }
  if (caption) figure.append(h("figcaption", {}, caption));
  if (faces.some((f) => f.box && f.label)) new ResizeObserver(() => shortenCrowdedLabels(frame)).observe(frame);
  return figure;
}

/** Labels that would cover a neighbour's keep their number only (the names are listed below the
 * photo): two faces side by side have labels running towards each other. Measured at each size. */
function shortenCrowdedLabels(frame) {
  const boxes = [...frame.querySelectorAll(".box")];
  boxes.forEach((box) => box.classList.remove("short"));
  const rects = boxes.map((box) => box.querySelector(".label")?.getBoundingClientRect());
  const cover = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const crowded = boxes.filter((_, i) => rects[i] && rects.some((r, j) => j !== i && r && cover(rects[i], r)));
  crowded.forEach((box) => box.classList.add("short"));
}

/** The face `box` cut out of the photo with a margin, as an <img> (the operator's own pixels). */
export async function faceCrop(blob, box, alt) {
  const bitmap = await createImageBitmap(blob);
  const [x1, y1, x2, y2] = box.map(Number);
  const side = Math.max(x2 - x1, y2 - y1) * 1.4;
  const cx = (x1 + x2) / 2;
  const cy = (y1 + y2) / 2;
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 160;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#f3f6f9";
  ctx.fillRect(0, 0, 160, 160);
  ctx.drawImage(bitmap, cx - side / 2, cy - side / 2, side, side, 0, 0, 160, 160);
  bitmap.close();
  const png = await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
  return h("img", { class: "crop", src: objectUrl(png), alt });
}

/** Thumbnails of picked files with a remove button each. */
export function pickedList(files, onRemove) {
  const list = h("ul", { class: "picked", "aria-label": "Photos picked" });
  files.forEach((file, index) =>
    list.append(
      h(
        "li",
        {},
        h("img", { src: objectUrl(file), alt: `Picked photo ${index + 1}` }),
        h("span", {}, file.name),
        h("button", { type: "button", class: "quiet small", onclick: () => onRemove(index) }, `Remove ${file.name}`),
      ),
    ),
  );
  return list;
}

/**
 * The camera (getUserMedia): a preview and a "Take photo" button; `onPhoto(file)` gets a JPEG.
 * Browsers allow it on HTTPS and on localhost only; elsewhere the panel says so.
 */
export function cameraPanel(onPhoto) {
  const panel = h("div", { class: "camera" });
  const status = h("p", { class: "note", role: "status" });
  let stream = null;
  const video = h("video", { autoplay: true, playsinline: true, muted: true, "aria-label": "Camera preview" });
  const stop = () => {
    if (stream) stream.getTracks().forEach((t) => t.stop());
    stream = null;
    cameras.delete(stop);
    replace(panel, start, status);
  };
  const shoot = h("button", { type: "button" }, "Take photo");
  const stopButton = h("button", { type: "button", class: "quiet" }, "Stop camera");
  shoot.addEventListener("click", async () => {
    const canvas = document.createElement("canvas");
    canvas.width = video.videoWidth;
    canvas.height = video.videoHeight;
    canvas.getContext("2d").drawImage(video, 0, 0);
    const jpeg = await new Promise((resolve) => canvas.toBlob(resolve, "image/jpeg", 0.92));
    onPhoto(new File([jpeg], `camera-${new Date().toISOString().replace(/[:.]/g, "-")}.jpg`, { type: "image/jpeg" }));
    status.textContent = "Photo taken.";
  });
  stopButton.addEventListener("click", stop);
  const start = h("button", { type: "button", class: "quiet" }, "Use the camera");
  start.addEventListener("click", async () => {
    if (!navigator.mediaDevices?.getUserMedia) {
      status.textContent = "The camera is available on HTTPS or on localhost only: serve the console over TLS to use it.";
      return;
    }
    try {
      stream = await navigator.mediaDevices.getUserMedia({ video: { facingMode: "user" }, audio: false });
    } catch (error) {
      status.textContent = `The camera could not be opened: ${error.message}`;
      return;
    }
    cameras.add(stop);
    video.srcObject = stream;
    replace(panel, video, h("div", { class: "actions" }, shoot, stopButton), status);
  });
  add(panel, [start, status]);
  return panel;
}
