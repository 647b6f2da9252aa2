// CompreFace's own JavaScript SDK (`@exadel/compreface-js-sdk` from npm), unchanged, under Node against
// a running facegate: add → list → recognize → verify → delete. Run by test_real_clients.py:
// node drive_compreface_js_sdk.mjs URL PORT KEY EXAMPLES, with FACEGATE_CLIENTS_JS the folder whose
// node_modules hold the SDK (ES modules resolve bare names from the importing file, not from NODE_PATH).
import assert from "node:assert/strict";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [url, port, key, examples] = process.argv.slice(2);
const sdk = join(process.env.FACEGATE_CLIENTS_JS, "node_modules", "@exadel", "compreface-js-sdk", "index.js");
const { CompreFace } = await import(pathToFileURL(sdk).href);

// The SDK reads a local file only from a path that starts with "." (else it takes a URL, base64 or a blob).
process.chdir(examples);
const compreFace = new CompreFace(url, port);
const recognition = compreFace.initFaceRecognitionService(key);
// Its face-collection calls append to a URL they share: a fresh collection per call, as its README does.
const faces = () => recognition.getFaceCollection();

const added = await faces().add("./knn_examples/train/obama/obama.jpg", "obama");
assert.equal(added.subject, "obama");
assert.ok(added.image_id, JSON.stringify(added));
assert.equal((await faces().add("./knn_examples/train/biden/biden.jpg", "biden")).subject, "biden");
const listed = await faces().list();
assert.deepEqual(listed.faces.map((f) => f.subject).sort(), ["biden", "obama"]);
assert.equal(listed.total_elements, 2);
assert.deepEqual((await recognition.getSubjects().list()).subjects.sort(), ["biden", "obama"]);

// The options of the SDK's README: ?limit=0&det_prob_threshold=0.8&prediction_count=1&status=true
const options = { limit: 0, det_prob_threshold: 0.8, prediction_count: 1, status: "true" };
const [found] = (await recognition.recognize("./knn_examples/test/obama1.jpg", options)).result;
assert.equal(found.subjects[0].subject, "obama", JSON.stringify(found));
assert.ok(found.subjects[0].similarity >= 0.5, JSON.stringify(found));
for (const field of ["probability", "x_min", "y_min", "x_max", "y_max"]) assert.equal(typeof found.box[field], "number");
const [stranger] = (await recognition.recognize("./lin-manuel-miranda.png", options)).result;
assert.ok(stranger.subjects[0].similarity < 0.5, JSON.stringify(stranger));

const verification = compreFace.initFaceVerificationService(key);
const same = await verification.verify("./knn_examples/train/obama/obama.jpg", "./knn_examples/train/obama/obama2.jpg", {});
assert.ok(same.result[0].face_matches[0].similarity >= 0.5, JSON.stringify(same));
const other = await verification.verify("./knn_examples/train/obama/obama.jpg", "./knn_examples/train/biden/biden.jpg", {});
assert.ok(other.result[0].face_matches[0].similarity < 0.5, JSON.stringify(other));

// a photo against a stored face (recognition/faces/{image_id}/verify)
const [match] = (await faces().verify("./knn_examples/train/obama/obama2.jpg", added.image_id, {})).result;
assert.equal(match.subject, "obama", JSON.stringify(match));
assert.ok(match.similarity >= 0.5, JSON.stringify(match));
const [mismatch] = (await faces().verify("./knn_examples/train/biden/biden.jpg", added.image_id, {})).result;
assert.ok(mismatch.similarity < 0.5, JSON.stringify(mismatch));

assert.deepEqual(await faces().delete(added.image_id), { image_id: added.image_id, subject: "obama" });
assert.deepEqual((await faces().list()).faces.map((f) => f.subject), ["biden"]);
assert.deepEqual(await faces().delete_all_subject("biden"), { deleted: 1 });
assert.deepEqual(await recognition.getSubjects().delete("biden"), { subject: "biden" });
console.log("@exadel/compreface-js-sdk: ok");
