"""`deepstack-python` (the client of Home Assistant's DeepStack face integration), unchanged,
against a running facegate: register → recognize → list → detect (it has no delete), with userids
as Home Assistant's teach_face sends them (a person's name, spaces and all). Run by
test_real_clients.py in the clients' Python: drive_deepstack_python.py HOST PORT KEY EXAMPLES."""

import sys
from pathlib import Path

import deepstack.core as ds

host, port, key, examples = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
face = ds.DeepstackFace(ip=host, port=port, api_key=key, timeout=60)

assert face.register("Barack Obama", (examples / "knn_examples/train/obama/obama.jpg").read_bytes()) == "face added"
assert face.register("barack obama", (examples / "knn_examples/train/obama/obama2.jpg").read_bytes()) == "face updated"  # one person
assert face.register("Joe Biden", (examples / "knn_examples/train/biden/biden.jpg").read_bytes()) == "face added"
assert sorted(face.get_registered_faces()) == ["Barack Obama", "Joe Biden"]

predictions = face.recognize((examples / "knn_examples/test/obama1.jpg").read_bytes())
assert list(ds.get_recognized_faces(predictions)) == ["Barack Obama"], predictions
stranger = face.recognize((examples / "lin-manuel-miranda.png").read_bytes())
assert [p["userid"] for p in stranger] == ["unknown"], stranger
assert len(face.detect((examples / "knn_examples/test/obama_and_biden.jpg").read_bytes())) >= 2

try:
    ds.DeepstackFace(ip=host, port=port, api_key="wrong", timeout=60).recognize((examples / "obama.jpg").read_bytes())
    raise AssertionError("a wrong api_key was accepted")
except ds.DeepstackException as exc:
    assert "401" in str(exc), exc
print("deepstack-python: ok")
