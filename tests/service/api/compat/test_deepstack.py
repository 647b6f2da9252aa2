"""DeepStack's / CodeProject.AI's face API (/v1/vision/face…) on facegate, with the default embedder
on real photos (face_recognition's examples): the calls and fields Double Take and Home Assistant's
DeepStack clients use, facegate's decision behind `userid`, and DeepStack's error shape."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from pydantic import SecretStr

pytestmark = pytest.mark.data

FACE = "/v1/vision/face"
BOX = {"x_min", "y_min", "x_max", "y_max"}


@pytest.fixture
def examples(test_data):
    return test_data / "tests" / "face_recognition" / "examples"


@pytest.fixture
def ds(model_cache, tmp_path, make_client):
    from service.core.settings import Settings

    return make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu"))


def photo(examples, name: str) -> bytes:
    return (examples / name).read_bytes()


def test_deepstack_round_trip(ds, examples):
    # Double Take registers one image per call; Home Assistant's client several under any names
    first = ds.post(f"{FACE}/register", files={"image": photo(examples, "knn_examples/train/obama/obama.jpg")}, data={"userid": "obama"})
    assert first.status_code == 200 and first.json()["success"] is True and first.json()["message"] == "face added", first.text
    again = ds.post(f"{FACE}/register", files={"image": photo(examples, "knn_examples/train/obama/obama2.jpg")}, data={"userid": "obama"})
    assert again.json()["message"] == "face updated"
    files = {
        "image1": photo(examples, "knn_examples/train/biden/biden.jpg"),
        "image2": photo(examples, "knn_examples/train/biden/biden2.jpg"),
    }
    assert ds.post(f"{FACE}/register", files=files, data={"userid": "biden"}).json()["success"] is True
    assert len(ds.get("/subjects/biden/faces").json()["faces"]) == 2  # one gallery: the native API sees them

    listed = ds.post(f"{FACE}/list").json()
    assert listed["success"] is True and sorted(listed["faces"]) == ["biden", "obama"]

    answer = ds.post(f"{FACE}/recognize", files={"image": photo(examples, "knn_examples/test/obama1.jpg")}).json()
    (prediction,) = answer["predictions"]
    assert answer["success"] is True and prediction["userid"] == "obama" and 0.5 <= prediction["confidence"] <= 1.0, answer
    assert set(prediction) == BOX | {"userid", "confidence"} and all(isinstance(prediction[k], int) for k in BOX)
    assert prediction["x_max"] > prediction["x_min"] >= 0 and prediction["y_max"] > prediction["y_min"] >= 0
    # min_confidence only tightens facegate's decision
    strict = ds.post(
        f"{FACE}/recognize", files={"image": photo(examples, "knn_examples/test/obama1.jpg")}, data={"min_confidence": "1"}
    ).json()
    assert strict["predictions"][0]["userid"] in ("obama", "unknown") and (strict["predictions"][0]["userid"] == "unknown") == (
        prediction["confidence"] < 1
    )
    loose = ds.post(f"{FACE}/recognize", files={"image": photo(examples, "lin-manuel-miranda.png")}, data={"min_confidence": "0"}).json()
    assert [(p["userid"], p["confidence"]) for p in loose["predictions"]] == [("unknown", 0)], loose  # a stranger

    both = ds.post(f"{FACE}/recognize", files={"image": photo(examples, "knn_examples/test/obama_and_biden.jpg")}).json()
    assert sorted(p["userid"] for p in both["predictions"] if p["userid"] != "unknown") == ["biden", "obama"], (
        both
    )  # and a face behind them

    detected = ds.post(FACE, files={"image": photo(examples, "knn_examples/test/obama_and_biden.jpg")}).json()
    assert detected["success"] is True and len(detected["predictions"]) == len(both["predictions"])
    assert all(set(p) == BOX | {"confidence"} and p["confidence"] > 0.5 for p in detected["predictions"])
    assert ds.post(FACE, files={"image": photo(examples, "obama.jpg")}, data={"min_confidence": "0.9999999"}).json()["predictions"] == []

    blank = cv2.imencode(".png", np.full((120, 120, 3), 128, np.uint8))[1].tobytes()
    for path in (FACE, f"{FACE}/recognize"):  # no face: success with no predictions, as DeepStack answers
        answer = ds.post(path, files={"image": blank})
        assert answer.status_code == 200 and answer.json()["success"] is True and answer.json()["predictions"] == []

    assert ds.post(f"{FACE}/delete", data={"userid": "obama"}).json()["success"] is True
    assert ds.post(f"{FACE}/list").json()["faces"] == ["biden"]
    gone = ds.post(f"{FACE}/recognize", files={"image": photo(examples, "knn_examples/test/obama1.jpg")}).json()
    assert gone["predictions"][0]["userid"] == "unknown"
    assert ds.post(f"{FACE}/delete", data={"userid": "nobody"}).json()["success"] is True  # DeepStack: success either way


def test_deepstack_userids_are_names(ds, examples):
    """Issue 36, items 1, 2 and 7: Home Assistant's teach_face with a real name; one userid whatever
    its case, answered as registered; delete answers success for any userid, as DeepStack does."""
    obama = photo(examples, "knn_examples/train/obama/obama.jpg")
    first = ds.post(f"{FACE}/register", files={"image": obama}, data={"userid": "Barack Obama"})
    assert first.status_code == 200 and first.json()["message"] == "face added", first.text
    again = ds.post(
        f"{FACE}/register", files={"image": photo(examples, "knn_examples/train/obama/obama2.jpg")}, data={"userid": "barack OBAMA"}
    )
    assert again.json()["message"] == "face updated"
    biden = ds.post(
        f"{FACE}/register", files={"image": photo(examples, "knn_examples/train/biden/biden.jpg")}, data={"userid": "Joe Biden 🇺🇸"}
    )
    assert biden.json()["success"] is True
    assert sorted(ds.post(f"{FACE}/list").json()["faces"]) == ["Barack Obama", "Joe Biden 🇺🇸"]
    (prediction,) = ds.post(f"{FACE}/recognize", files={"image": photo(examples, "knn_examples/test/obama1.jpg")}).json()["predictions"]
    assert prediction["userid"] == "Barack Obama" and prediction["confidence"] >= 0.5, prediction

    for invalid in ("x" * 257, "a\x00b", "   "):  # no subject can hold it: nothing deleted, success
        answer = ds.post(f"{FACE}/delete", data={"userid": invalid})
        assert answer.status_code == 200 and answer.json()["success"] is True, answer.text
    assert ds.post(f"{FACE}/delete", data={"userid": "Nobody"}).json()["success"] is True
    assert len(ds.post(f"{FACE}/list").json()["faces"]) == 2
    assert ds.post(f"{FACE}/delete", data={"userid": "BARACK OBAMA"}).json()["success"] is True
    assert ds.post(f"{FACE}/list").json()["faces"] == ["Joe Biden 🇺🇸"]
    gone = ds.post(f"{FACE}/recognize", files={"image": photo(examples, "knn_examples/test/obama1.jpg")}).json()
    assert [p["userid"] for p in gone["predictions"]] == ["unknown"]


def test_deepstack_bad_input_keeps_its_shape(ds, examples):
    blank = cv2.imencode(".png", np.full((120, 120, 3), 128, np.uint8))[1].tobytes()
    cases = [
        (f"{FACE}/recognize", {}, {}, "No valid image file found"),
        (f"{FACE}/recognize", {"photo": b"x"}, {}, "No valid image file found"),
        (f"{FACE}/recognize", {"image": b"not an image"}, {}, None),
        (f"{FACE}/recognize", {"image": blank}, {"min_confidence": "abc"}, "Invalid value for min_confidence"),
        (f"{FACE}/recognize", {"image": blank}, {"min_confidence": "nan"}, "Invalid value for min_confidence"),
        (FACE, {"image": blank}, {"min_confidence": "1.5"}, "min_confidence cannot be greater than 1"),
        (f"{FACE}/register", {"image": photo(examples, "obama.jpg")}, {}, "userid not specified"),
        (f"{FACE}/register", {}, {"userid": "obama"}, "No valid image file found"),
        (f"{FACE}/register", {"image": blank}, {"userid": "obama"}, None),
        (f"{FACE}/register", {"image": photo(examples, "obama.jpg")}, {"userid": "x" * 257}, None),  # over the name limit
        (f"{FACE}/register", {"image": photo(examples, "obama.jpg")}, {"userid": "User\tName"}, None),  # a control character
        (f"{FACE}/delete", {}, {}, "userid not specified"),
    ]
    for path, files, data, message in cases:
        answer = ds.post(path, files=files or None, data=data)
        body = answer.json()
        assert 400 <= answer.status_code < 500 and body["success"] is False and body["error"], (path, data, answer.status_code, body)
        assert message is None or body["error"] == message, (path, body)
    assert ds.post(f"{FACE}/list").json()["faces"] == []  # nothing was half-registered
    json_body = ds.post(f"{FACE}/recognize", json={"image": "aGVsbG8="})
    assert json_body.status_code == 400 and json_body.json()["success"] is False


def test_deepstack_api_key(model_cache, tmp_path, make_client, examples):
    from service.core.settings import Settings

    ds = make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu", api_keys=SecretStr("s3cret")))
    image = photo(examples, "obama.jpg")
    for data, headers in (({}, {}), ({"api_key": "wrong"}, {}), ({"api_key": ["s3cret", "s3cret"]}, {})):
        answer = ds.post(f"{FACE}/recognize", files={"image": image}, data=data, headers=headers)
        assert answer.status_code == 401 and answer.json()["success"] is False and answer.json()["error"] == "Incorrect api key", (
            answer.text
        )
    assert ds.post(f"{FACE}/list").status_code == 401
    # DeepStack's form field, or facegate's header: one key works on every API
    assert ds.post(f"{FACE}/register", files={"image": image}, data={"userid": "obama", "api_key": "s3cret"}).json()["success"] is True
    assert ds.post(f"{FACE}/list", data={"api_key": "s3cret"}).json()["faces"] == ["obama"]
    assert ds.post(f"{FACE}/list", headers={"X-API-Key": "s3cret"}).json()["faces"] == ["obama"]
    # the form field opens only the DeepStack routes
    assert ds.post("/identify", files={"image": image}, data={"api_key": "s3cret"}).status_code == 401
    assert ds.post(f"{FACE}/match", data={"api_key": "s3cret"}).status_code == 401


def test_deepstack_routes_stay_out_of_the_schema(api):
    assert not [path for path in api.get("/openapi.json").json()["paths"] if path.startswith("/v1/")]
