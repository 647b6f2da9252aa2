"""DeepStack's own Python SDK (`deepstack-sdk`), unchanged, against a running facegate:
register → recognize → list → delete, userids with spaces, one whatever its case. Run by
test_real_clients.py in the clients' Python:
drive_deepstack_sdk.py URL KEY EXAMPLES."""

import sys
from pathlib import Path

from deepstack_sdk import Face, ServerConfig

url, key, examples = sys.argv[1], sys.argv[2], Path(sys.argv[3])
face = Face(ServerConfig(url, api_key=key))

assert face.registerFace(
    [str(examples / "knn_examples/train/obama/obama.jpg"), str(examples / "knn_examples/train/obama/obama2.jpg")], "Barack Obama"
)
assert face.registerFace([str(examples / "knn_examples/train/biden/biden.jpg")], "Joe Biden")
assert sorted(face.listFaces()) == ["Barack Obama", "Joe Biden"]

# its default min_confidence, 0.7, is held on the calibrated scale: stricter than facegate's 0.5
found = face.recognizeFace(str(examples / "knn_examples/test/obama1.jpg"), min_confidence=0.5)
assert [(f.userid, f.confidence >= 0.5) for f in found] == [("Barack Obama", True)], [vars(f) for f in found]
assert [f.userid for f in face.recognizeFace(str(examples / "lin-manuel-miranda.png"))] == ["unknown"]
assert len(face.detectFace(str(examples / "knn_examples/test/obama_and_biden.jpg"))) >= 2

assert face.deleteFace("BARACK OBAMA")
assert list(face.listFaces()) == ["Joe Biden"]
print("deepstack-sdk: ok")
