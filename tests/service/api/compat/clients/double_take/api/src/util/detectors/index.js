// Stand-in for Double Take's detectors/index.js: the three detectors facegate answers for, without
// facebox and rekognition (which need the AWS SDK).
module.exports = {
  compreface: require('./compreface'),
  deepstack: require('./deepstack'),
  aiserver: require('./aiserver'),
};
