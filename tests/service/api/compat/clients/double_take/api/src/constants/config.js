// Stand-in for Double Take's constants/config.js, which reads config.yml and secrets from its storage:
// the defaults of defaults.js as they are, and a config.yml naming the one detector under test at
// DOUBLE_TAKE_URL with the key DOUBLE_TAKE_KEY. Only what the detector modules read: the config
// itself and detect(camera), written as the original writes it for a camera without its own settings.
const { objectKeysToUpperCase } = require('../util/object.util');
const { detectors: DETECTORS, notify: NOTIFY, ...DEFAULTS } = require('./defaults');

// The fork's defaults for aiserver (1.13.1 has no such detector).
const AISERVER = { timeout: 15, opencv_face_required: false };
const CONFIG = {
  ...DEFAULTS,
  detectors: {
    compreface: { ...DETECTORS.compreface, url: process.env.DOUBLE_TAKE_URL, key: process.env.DOUBLE_TAKE_KEY },
    deepstack: { ...DETECTORS.deepstack, url: process.env.DOUBLE_TAKE_URL, key: process.env.DOUBLE_TAKE_KEY },
    aiserver: { ...AISERVER, url: process.env.DOUBLE_TAKE_URL },
  },
};

module.exports = () => CONFIG;

module.exports.detect = (camera) => {
  const detect = JSON.parse(JSON.stringify(CONFIG.detect));
  if (!camera) return objectKeysToUpperCase(detect);
  delete detect.match.purge;
  delete detect.unknown.purge;
  return objectKeysToUpperCase(detect);
};
