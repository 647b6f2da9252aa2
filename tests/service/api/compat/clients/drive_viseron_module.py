"""Viseron's CompreFace face recognition, its own module (viseron/components/compreface/, copied
unchanged from roflcoopter/viseron 6388aa85, MIT: viseron/LICENSE), on compreface-sdk, against a
running facegate. Viseron itself is no library: the few names the module imports from it stand in
here (the post-processor's base, which records the faces the module reports; two helpers as
Viseron writes them). Training is its CompreFaceTrain over a folder per person; recognition is its
`face_recognition` on each photo as one detected object covering the frame, at its defaults.
Run in the clients' Python: drive_viseron_module.py HOST PORT KEY PLAN.json (PLAN: {"train":
[[name, photo]], "probes": [photo]}); prints {"unsuitable": [photo], "results": {photo: faces}}."""

import json
import logging
import math
import os
import re
import sys
import tempfile
import types
from pathlib import Path

import cv2

host, port, key, plan = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(Path(sys.argv[4]).read_text())
FACE_RECOGNITION_PATH = "face_recognition_path"  # viseron.domains.face_recognition.const


class AbstractFaceRecognition:
    """Stands in for viseron.domains.face_recognition's: keeps what the module reports."""

    def __init__(self, vis, component, config, camera_identifier, *, generate_entities=True):
        self._vis, self._config, self._camera = vis, config, vis.camera
        self._logger = logging.getLogger(component)
        self.faces = []

    def known_face_found(self, face, coordinates, shared_frame, confidence=None, extra_attributes=None):
        self.faces.append({"face": face, "known": True, "similarity": confidence})

    def unknown_face_found(self, coordinates, shared_frame, confidence=None, extra_attributes=None):
        self.faces.append({"face": "unknown", "known": False, "similarity": confidence})


def calculate_absolute_coords(bounding_box, frame_res):  # viseron/helpers/__init__.py
    return (
        math.floor(bounding_box[0] * frame_res[0]),
        math.floor(bounding_box[1] * frame_res[1]),
        math.floor(bounding_box[2] * frame_res[0]),
        math.floor(bounding_box[3] * frame_res[1]),
    )


def get_image_files_in_folder(folder):  # viseron/helpers/__init__.py
    return [os.path.join(folder, f) for f in os.listdir(folder) if re.match(r".*\.(jpg|jpeg|png)", f, flags=re.I)]


def stand_in(name, **names):
    module = types.ModuleType(name)
    module.__dict__.update(names)
    sys.modules[name] = module
    return module


for package in ("viseron", "viseron.domains", "viseron.components"):
    stand_in(package).__path__ = []
stand_in("viseron.domains.face_recognition", AbstractFaceRecognition=AbstractFaceRecognition).__path__ = []
stand_in("viseron.domains.face_recognition.binary_sensor", FaceDetectionBinarySensor=object)
stand_in("viseron.domains.face_recognition.const", CONFIG_FACE_RECOGNITION_PATH=FACE_RECOGNITION_PATH, DOMAIN="face_recognition")
stand_in("viseron.helpers", calculate_absolute_coords=calculate_absolute_coords, get_image_files_in_folder=get_image_files_in_folder)
stand_in("viseron.components.compreface").__path__ = [str(Path(__file__).parent / "viseron" / "components" / "compreface")]

from viseron.components.compreface import const, face_recognition  # noqa: E402  (the module, unchanged)

unsuitable = []


class Unsuitable(logging.Handler):
    def emit(self, record):
        if "not suitable for training" in record.getMessage():
            unsuitable.append(record.getMessage())


face_recognition.LOGGER.addHandler(Unsuitable())
with tempfile.TemporaryDirectory() as train_dir:
    for name, photo in plan["train"]:  # its folder structure: one folder per person
        os.makedirs(os.path.join(train_dir, name), exist_ok=True)
        os.symlink(photo, os.path.join(train_dir, name, os.path.basename(photo)))
    config = {
        const.CONFIG_FACE_RECOGNITION: {  # its schema's defaults
            const.CONFIG_HOST: host,
            const.CONFIG_PORT: port,
            const.CONFIG_API_KEY: key,
            const.CONFIG_TRAIN: True,
            const.CONFIG_DET_PROB_THRESHOLD: const.DEFAULT_DET_PROB_THRESHOLD,
            const.CONFIG_SIMILARITTY_THRESHOLD: const.DEFAULT_SIMILARITTY_THRESHOLD,
            const.CONFIG_LIMIT: const.DEFAULT_LIMIT,
            const.CONFIG_PREDICTION_COUNT: const.DEFAULT_PREDICTION_COUNT,
            const.CONFIG_FACE_PLUGINS: const.DEFAULT_FACE_PLUGINS,
            const.CONFIG_STATUS: const.DEFAULT_STATUS,
            const.CONFIG_USE_SUBJECTS: const.DEFAULT_USE_SUBJECTS,
            FACE_RECOGNITION_PATH: train_dir,
        }
    }
    vis = types.SimpleNamespace(data={const.COMPONENT: {const.CONFIG_FACE_RECOGNITION: face_recognition.CompreFaceService(config)}})
    face_recognition.CompreFaceTrain(vis, config)

results = {}
for photo in plan["probes"]:
    frame = cv2.imread(photo)
    vis.camera = types.SimpleNamespace(identifier="camera", resolution=(frame.shape[1], frame.shape[0]))
    recognizer = face_recognition.FaceRecognition(vis, config, "camera")
    whole = types.SimpleNamespace(rel_x1=0.0, rel_y1=0.0, rel_x2=1.0, rel_y2=1.0)
    recognizer.face_recognition(types.SimpleNamespace(frame=frame, shared_frame=None), whole)
    results[photo] = recognizer.faces
print(json.dumps({"unsuitable": unsuitable, "results": results}))
