"""The model layer: manifests, onnxruntime providers and sessions, the model files (find, pull,
verify, load) and the detector and embedder that run the loaded sessions."""
