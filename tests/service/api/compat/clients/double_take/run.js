// Double Take's own detector modules under api/ (copied unchanged: 1.13.1's compreface.js and
// deepstack.js, the skrashevich fork's aiserver.js; LICENSE and LICENSE.skrashevich), driven as
// Double Take drives them (train.util.js, process.util.js), against a running facegate:
//   DOUBLE_TAKE_URL=http://127.0.0.1:PORT DOUBLE_TAKE_KEY=KEY NODE_PATH=<axios, form-data> node run.js DETECTOR PLAN.json
// PLAN: {"train": [[name, photo path], ...], "probes": [photo path, ...]}. Each name is untrained
// first (its `remove`), then each photo trained; each probe is recognized and its answer read by the
// detector's own `normalize` at Double Take's defaults. Prints {"trained": [...], "results": {probe: faces}}.
const fs = require('fs');
const actions = require('./api/src/util/detectors/actions');

const [detector, planPath] = process.argv.slice(2);
const plan = JSON.parse(fs.readFileSync(planPath, 'utf8'));
const CAMERA = 'manual'; // what Double Take names an uploaded photo's camera

const main = async () => {
  for (const name of new Set(plan.train.map(([n]) => n))) {
    await actions.remove({ name, detector }).catch(() => null);
  }
  const trained = [];
  for (const [name, key] of plan.train) {
    // train.util.js: an answer outside 2xx is an error recorded against the file
    const outcome = await actions
      .train({ name, key, detector })
      .then(({ status }) => ({ status }))
      .catch((error) => ({ status: error.response ? error.response.status : 500, error: error.message }));
    trained.push({ name, key, ...outcome });
  }
  const results = {};
  for (const key of plan.probes) {
    try {
      const { data } = await actions.recognize({ detector, key });
      results[key] = actions.normalize({ camera: CAMERA, detector, data });
    } catch (error) {
      results[key] = { error: error.message }; // process.util.js logs it: the photo has no results
    }
  }
  process.stdout.write(JSON.stringify({ trained, results }));
};

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
