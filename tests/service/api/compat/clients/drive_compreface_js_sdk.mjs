// CompreFace's own JavaScript SDK (`@exadel/compreface-js-sdk` from npm), unchanged, under Node against
// a running facegate: add → list → recognize → verify → delete → rename (and its merge), with subjects named as CompreFace
// names them (one subject whatever its case), `status` and its answer to a wrong key. Run by test_real_clients.py:
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

// The SDK puts a subject into its URLs as it is given: a name with a space is passed encoded.
const added = await faces().add("./knn_examples/train/obama/obama.jpg", encodeURIComponent("Barack Obama"));
assert.equal(added.subject, "Barack Obama");
assert.ok(added.image_id, JSON.stringify(added));
assert.equal((await faces().add("./knn_examples/train/biden/biden.jpg", "Biden")).subject, "Biden");
assert.equal((await faces().add("./knn_examples/train/biden/biden2.jpg", "BIDEN")).subject, "BIDEN"); // the same subject
const listed = await faces().list();
assert.deepEqual(listed.faces.map((f) => f.subject).sort(), ["Barack Obama", "Biden", "Biden"]);
assert.equal(listed.total_elements, 3);
assert.deepEqual((await recognition.getSubjects().list()).subjects.sort(), ["Barack Obama", "Biden"]);

// The options of the SDK's README: ?limit=0&det_prob_threshold=0.8&prediction_count=1&status=true
const options = { limit: 0, det_prob_threshold: 0.8, prediction_count: 1, status: "true" };
const recognized = await recognition.recognize("./knn_examples/test/obama1.jpg", options);
const [found] = recognized.result;
assert.equal(found.subjects[0].subject, "Barack Obama", JSON.stringify(found));
assert.ok(found.subjects[0].similarity >= 0.5, JSON.stringify(found));
for (const field of ["probability", "x_min", "y_min", "x_max", "y_max"]) assert.equal(typeof found.box[field], "number");
// status=true: what detection and embedding took, and the plugins' versions
assert.ok(found.execution_time.detector > 0 && found.execution_time.calculator > 0, JSON.stringify(found));
assert.equal(recognized.plugins_versions.detector, "facegate");
const quiet = await recognition.recognize("./knn_examples/test/obama1.jpg", { ...options, status: "false" });
assert.ok(!("plugins_versions" in quiet) && !("execution_time" in quiet.result[0]), JSON.stringify(quiet));
const [stranger] = (await recognition.recognize("./lin-manuel-miranda.png", options)).result;
assert.ok(stranger.subjects[0].similarity < 0.5, JSON.stringify(stranger));

const verification = compreFace.initFaceVerificationService(key);
const same = await verification.verify("./knn_examples/train/obama/obama.jpg", "./knn_examples/train/obama/obama2.jpg", {});
assert.ok(same.result[0].face_matches[0].similarity >= 0.5, JSON.stringify(same));
const other = await verification.verify("./knn_examples/train/obama/obama.jpg", "./knn_examples/train/biden/biden.jpg", {});
assert.ok(other.result[0].face_matches[0].similarity < 0.5, JSON.stringify(other));

// a photo against a stored face (recognition/faces/{image_id}/verify)
const [match] = (await faces().verify("./knn_examples/train/obama/obama2.jpg", added.image_id, {})).result;
assert.equal(match.subject, "Barack Obama", JSON.stringify(match));
assert.ok(match.similarity >= 0.5, JSON.stringify(match));
const [mismatch] = (await faces().verify("./knn_examples/train/biden/biden.jpg", added.image_id, {})).result;
assert.ok(mismatch.similarity < 0.5, JSON.stringify(mismatch));

// one face deleted: its subject stays; all of them: the subject goes; an unknown subject: nothing, a 200
assert.deepEqual(await faces().delete(added.image_id), { image_id: added.image_id, subject: "Barack Obama" });
assert.deepEqual((await recognition.getSubjects().list()).subjects.sort(), ["Barack Obama", "Biden"]);
assert.deepEqual((await faces().list()).faces.map((f) => f.subject), ["Biden", "Biden"]);
assert.deepEqual(await faces().delete_all_subject("biden"), { deleted: 2 });
assert.deepEqual(await faces().delete_all_subject("Nobody"), { deleted: 0 });
assert.deepEqual((await recognition.getSubjects().list()).subjects, ["Barack Obama"]);
assert.deepEqual(await recognition.getSubjects().delete(encodeURIComponent("barack obama")), { subject: "Barack Obama" });

// a rename; onto a name another subject holds (whatever its case), a merge of the two, as CompreFace does
assert.equal((await faces().add("./knn_examples/train/obama/obama.jpg", "Obama")).subject, "Obama");
assert.equal((await faces().add("./knn_examples/train/obama/obama2.jpg", "Barack")).subject, "Barack");
assert.deepEqual(await recognition.getSubjects().rename("Barack", "OBAMA"), { updated: true });
assert.deepEqual((await recognition.getSubjects().list()).subjects, ["Obama"]);
assert.equal((await faces().list()).total_elements, 2);
assert.deepEqual(await recognition.getSubjects().rename("Obama", "Barack Obama"), { updated: true });
assert.deepEqual((await recognition.getSubjects().list()).subjects, ["Barack Obama"]);

// a wrong key: the SDK rejects with axios's error, whose body is CompreFace's {message, code}
const wrong = compreFace.initFaceRecognitionService("wrong-key");
await assert.rejects(wrong.getSubjects().list(), (error) => error.response.status === 401 && error.response.data.code === 10 && !!error.response.data.message);
console.log("@exadel/compreface-js-sdk: ok");
