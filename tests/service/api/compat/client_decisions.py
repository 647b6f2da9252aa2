"""What home-automation clients decide on facegate's answers, with their own code: Double Take's
detector modules (clients/double_take/, unchanged, under Node) and Viseron's CompreFace face
recognition (clients/viseron/, unchanged, in the clients' Python), trained on one photo set and
asked about every other photo of it. test_client_decisions.py asserts the goal on it and
benchmarks/client_decisions.py prints the table for any running facegate.

The photo set, from $FACEGATE_TEST_DATA/tests: 5 people trained from face_recognition's
knn_examples/train (9 photos); 15 photos of them not trained on (18 of their faces, and a child
behind Obama and Biden; the examples' copies of a training photo left out); 19 photos of strangers
(lin-manuel-miranda.png and CompreFace's 18 samples: 47 faces by its annotations.json, one photo
without a face). 66 faces: 18 known, 48 strangers."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

CLIENTS = Path(__file__).parent / "clients"
TRAIN = {
    "alex_lacamoire": ["img1.jpg"],
    "biden": ["biden.jpg", "biden2.jpg"],
    "kit_harington": ["john1.jpeg", "john2.jpeg"],
    "obama": ["obama.jpg", "obama2.jpg"],
    "rose_leslie": ["img1.jpg", "img2.jpg"],
}
# photo (under tests/face_recognition) → the trained people on it
KNOWN = {
    "examples/knn_examples/test/alex_lacamoire1.jpg": ("alex_lacamoire",),
    "examples/knn_examples/test/johnsnow_test1.jpg": ("kit_harington",),
    "examples/knn_examples/test/kit_with_rose.jpg": ("kit_harington", "rose_leslie"),
    "examples/knn_examples/test/obama1.jpg": ("obama",),
    "examples/knn_examples/test/obama_and_biden.jpg": ("obama", "biden"),
    "examples/alex-lacamoire.png": ("alex_lacamoire",),
    "examples/obama-240p.jpg": ("obama",),
    "examples/obama-480p.jpg": ("obama",),
    "examples/obama-720p.jpg": ("obama",),
    "examples/obama-1080p.jpg": ("obama",),
    "examples/obama_small.jpg": ("obama",),
    "examples/two_people.jpg": ("obama", "biden"),
    "tests/test_images/obama3.jpg": ("obama",),
    "tests/test_images/obama_partial_face.jpg": ("obama",),
    "tests/test_images/obama_partial_face2.jpg": ("obama",),
}
BACKGROUND = {"examples/knn_examples/test/obama_and_biden.jpg": 1}  # a child behind them: a stranger's face
DOUBLE_TAKE = {"compreface": "double-take", "deepstack": "double-take", "aiserver": "double-take-fork"}
VISERON_SIMILARITY_THRESHOLD = 0.5  # its components/compreface/const.py DEFAULT_SIMILARITTY_THRESHOLD


@dataclass(frozen=True)
class Photo:
    path: Path
    people: tuple[str, ...]  # the trained people on it
    strangers: int  # faces of anyone else


@dataclass(frozen=True)
class Tally:
    """One client's decisions over the set: known faces named right, stranger faces named at all."""

    found: int
    knowns: int
    named_strangers: int
    strangers: int
    missed: tuple[str, ...]  # "photo: person" not found
    wrong: tuple[str, ...]  # "photo: name" given where no such person is

    @property
    def right(self) -> int:
        return self.found + self.strangers - self.named_strangers

    @property
    def faces(self) -> int:
        return self.knowns + self.strangers


def train_photos(data: Path) -> list[tuple[str, Path]]:
    folder = data / "tests" / "face_recognition" / "examples" / "knn_examples" / "train"
    return [(name, folder / name / file) for name, files in TRAIN.items() for file in files]


def probes(data: Path) -> list[Photo]:
    tests = data / "tests"
    photos = [Photo(tests / "face_recognition" / path, people, BACKGROUND.get(path, 0)) for path, people in KNOWN.items()]
    photos.append(Photo(tests / "face_recognition" / "examples" / "lin-manuel-miranda.png", (), 1))
    annotations = json.loads((tests / "compreface" / "annotations.json").read_text())
    photos += [Photo(tests / "compreface" / name, (), entry["faces"]) for name, entry in sorted(annotations.items())]
    return photos


def tally(photos: list[Photo], named: dict[str, list[str]]) -> Tally:
    """`named`: per photo path, the name the client gave each face it matched. A person counts as
    found where their name is among them; every other name given (another person's, a name
    twice) is a stranger or a trained person named wrong."""
    found, missed, wrong = 0, [], []
    for photo in photos:
        names = list(named.get(str(photo.path), []))
        for person in photo.people:
            if person in names:
                names.remove(person)
                found += 1
            else:
                missed.append(f"{photo.path.name}: {person}")
        wrong += [f"{photo.path.name}: {name}" for name in names]
    knowns = sum(len(p.people) for p in photos)
    strangers = sum(p.strangers for p in photos)
    return Tally(found, knowns, min(len(wrong), strangers), strangers, tuple(missed), tuple(wrong))


def clients_js() -> Path:
    return Path(os.environ.get("FACEGATE_CLIENTS_JS") or REPO / ".clients-js")


@contextmanager
def plan_file(train: list[tuple[str, Path]], photos: list[Photo]) -> Iterator[str]:
    """The photos to train (name, photo) and to ask about, as the drivers read them."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump({"train": [[n, str(p)] for n, p in train], "probes": [str(p.path) for p in photos]}, file)
        file.flush()
        yield file.name


def double_take(
    node: str, detector: str, url: str, key: str, train: list[tuple[str, Path]], photos: list[Photo]
) -> tuple[list[dict], dict[str, list[dict]]]:
    """Double Take's `detector` module trained and asked about every photo: what it trained
    (name, photo, HTTP status) and its normalized faces per photo."""
    with plan_file(train, photos) as plan:
        env = {
            **os.environ,
            "DOUBLE_TAKE_URL": url,
            "DOUBLE_TAKE_KEY": key,
            "NODE_PATH": str(clients_js() / DOUBLE_TAKE[detector] / "node_modules"),
        }
        run = subprocess.run(
            [node, str(CLIENTS / "double_take" / "run.js"), detector, plan], capture_output=True, text=True, env=env, timeout=600
        )
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout)
    return answer["trained"], answer["results"]


def double_take_named(results: dict[str, list[dict] | dict], matched: bool = True) -> dict[str, list[str]]:
    """The names Double Take gives faces: those it counts as a match (its `match`: 60 % and a box of
    10,000 px²), or with `matched=False` every name it shows (40 % and up, else `unknown`)."""
    return {
        photo: [f["name"] for f in faces if (f["match"] if matched else f["name"] != "unknown")]
        for photo, faces in results.items()
        if isinstance(faces, list)
    }


def viseron(
    python: str, host: str, port: int, key: str, train: list[tuple[str, Path]], photos: list[Photo]
) -> tuple[list[str], dict[str, list[dict]]]:
    """Viseron's CompreFace training and face recognition (clients/drive_viseron_module.py): the
    photos it logged as not suitable for training, and per photo its faces (known or unknown)."""
    with plan_file(train, photos) as plan:
        run = subprocess.run(
            [python, str(CLIENTS / "drive_viseron_module.py"), host, str(port), key, plan],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    answer = json.loads(run.stdout.splitlines()[-1])
    return answer["unsuitable"], answer["results"]


def viseron_named(results: dict[str, list[dict]]) -> dict[str, list[str]]:
    return {photo: [f["face"] for f in faces if f["known"]] for photo, faces in results.items()}
