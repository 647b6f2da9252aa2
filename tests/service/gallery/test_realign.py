"""Re-embedding after a change to a model that aligns differently: the stored loose chip re-aligns
like the original photo, a gallery of the schema before versions (112×112 arcface_112 crops) is
migrated and re-embedded, and migrations are idempotent. Real LFW photos, YuNet and test embedders."""

from __future__ import annotations

import json
import sqlite3

import cv2
import numpy as np
import pytest

from service.core.alignment import ARCFACE_112, LOOSE, TEMPLATES, FaceChip, align_face, loose_chip, template_chip
from service.core.models.manifest import EmbedderKey, Manifest
from service.gallery.interface import NewFace
from service.gallery.sqlite import DATABASE, SCHEMA_VERSION, SqliteGallery, decode_crop, encode_crop
from tests.onnx_models import write_test_embedder

OLD = EmbedderKey("old-model", "0" * 64, 64)
PEOPLE = ("Aaron_Peirsol", "Colin_Powell", "Tony_Blair")

# A template unlike arcface_112: another size, scale and offset, and another shape (eyes wider
# apart, mouth lower), so no similarity maps one template onto the other — as with dlib's.
SHAPE = np.array([[-4.0, 0.0], [4.0, 0.0], [0.0, -2.0], [-2.0, 6.0], [2.0, 6.0]])
TEST_150 = ("test_150", (ARCFACE_112 * 1.15 + [10.0, 18.0] + SHAPE, 150))

# The faces table exactly as it was before schema versions (PRAGMA user_version 0): a fixture of
# the old version, not imported from the code, so the upgrade path keeps being tested.
SCHEMA_V0 = """
CREATE TABLE IF NOT EXISTS subjects (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS subjects_created ON subjects (created, id);
CREATE TABLE IF NOT EXISTS faces (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: an id in flight cannot alias a new face
    subject_id TEXT NOT NULL REFERENCES subjects (id) ON DELETE CASCADE,
    embedding BLOB NOT NULL,               -- float32 little-endian, L2-normalized
    model_name TEXT NOT NULL,
    model_sha256 TEXT NOT NULL,
    box TEXT,                              -- JSON [x1, y1, x2, y2]; NULL for an aligned upload
    landmarks TEXT,
    score REAL,
    crop BLOB,                             -- PNG of the aligned crop, only with FACEGATE_STORE_CROPS
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS faces_subject ON faces (subject_id);
CREATE INDEX IF NOT EXISTS faces_model ON faces (model_sha256);
"""


@pytest.fixture
def photos(test_data, pipeline):
    """(name, BGR image, detected landmarks) of a few LFW photos."""
    out = []
    for name in PEOPLE:
        image = cv2.imread(str(min((test_data / "lfw" / name).glob("*.jpg"))), cv2.IMREAD_COLOR)
        out.append((name, image, pipeline.detect(image)[0].landmarks))
    return out


@pytest.fixture
def new_pipeline(monkeypatch, settings, tmp_path):
    """A pipeline whose embedder takes 150×150 crops aligned onto TEST_150."""
    from service.core.pipeline import FacePipeline

    monkeypatch.setitem(TEMPLATES, *TEST_150)
    manifest = write_test_embedder(tmp_path / "new", name="new-embedder", size=150, alignment=TEST_150[0])
    return FacePipeline.from_settings(settings.model_copy(update={"embedder": str(manifest)}))


def key_of(pipeline) -> EmbedderKey:
    return EmbedderKey.of(pipeline.embedder_model.manifest)


def _coordinates(shape: tuple[int, int]) -> np.ndarray:
    """float32 image of (x, y, 1) at each pixel, in BGR order (channel 0 is x)."""
    y, x = np.mgrid[: shape[0], : shape[1]].astype(np.float32)
    return np.dstack([x, y, np.ones_like(x)])


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


@pytest.mark.data
def test_loose_chip_realigns_like_the_original_photo(photos, monkeypatch):
    monkeypatch.setitem(TEMPLATES, *TEST_150)
    for _, image, landmarks in photos:
        chip = loose_chip(image, landmarks)
        assert chip.image.shape == (320, 320, 3) and chip.frame == LOOSE
        stored = decode_crop(encode_crop(chip.image))  # what the gallery keeps (PNG, lossless)
        for template in ("arcface_112", TEST_150[0]):
            # geometry: on an image whose pixels hold their own coordinates (bilinear interpolation
            # keeps them exact), the re-aligned chip samples the photo where direct alignment does
            coordinates = _coordinates(image.shape[:2])
            sampled = loose_chip(coordinates, landmarks).align(template)
            wanted = align_face(coordinates, landmarks, template)  # both now (1, y, x): RGB order
            inside = (wanted[..., 0] > 0.999) & (sampled[..., 0] > 0.999)  # pixels from within the photo in both
            assert inside.mean() > 0.5 and np.abs(sampled - wanted)[inside].max() < 0.02, template
            # pixels: the same crop up to a second interpolation
            direct = align_face(image, landmarks, template)
            again = FaceChip(stored, chip.landmarks, chip.frame).align(template)
            assert again.shape == direct.shape
            assert mean_abs(again, direct) < 3.0, template
        # the chip is not the template crop: a wrong re-alignment would be far off
        assert mean_abs(align_face(image, landmarks, TEST_150[0]), cv2.resize(align_face(image, landmarks), (150, 150))) > 10


def _old_gallery(tmp_path, photos) -> list[tuple[int, bytes, bytes]]:
    """A database of the schema before versions, filled the old way: (id, embedding, crop) per face."""
    db = sqlite3.connect(tmp_path / DATABASE)
    db.executescript(SCHEMA_V0)
    rows = []
    for i, (name, image, landmarks) in enumerate(photos):
        db.execute("INSERT INTO subjects VALUES (?, ?, ?, ?, ?)", (name, name, "{}", 1.0 + i, 1.0 + i))
        embedding = np.random.default_rng(i).standard_normal(64).astype("<f4").tobytes()
        crop = encode_crop(align_face(image, landmarks))  # 112×112 arcface_112, as enrollment stored it
        cursor = db.execute(
            "INSERT INTO faces (subject_id, embedding, model_name, model_sha256, box, landmarks, score, crop, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, embedding, OLD.name, OLD.sha256, "[1, 2, 3, 4]", json.dumps(landmarks.tolist()), 0.9, crop, 5.0),
        )
        rows.append((cursor.lastrowid, embedding, crop))
    db.execute(
        "INSERT INTO faces (subject_id, embedding, model_name, model_sha256, created) VALUES (?, ?, ?, ?, ?)",
        (PEOPLE[0], rows[0][1], OLD.name, OLD.sha256, 6.0),
    )
    db.commit()
    db.close()
    return rows


def _columns(path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [r[1] for r in db.execute("PRAGMA table_info(faces)")]
    finally:
        db.close()


@pytest.mark.data
def test_upgrade_from_the_gallery_before_versions(tmp_path, photos, new_pipeline):
    rows = _old_gallery(tmp_path, photos)
    gallery = SqliteGallery.open(tmp_path, OLD)
    assert gallery._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert gallery.index.size == 4 and gallery.counts() == {"subjects": 3, "faces": 4, "searchable_faces": 4, "incompatible_faces": 0}
    stored = gallery._db.execute("SELECT id, embedding, crop, crop_frame, crop_landmarks FROM faces ORDER BY id").fetchall()
    for (face_id, embedding, crop), row in zip(rows, stored[: len(rows)], strict=True):  # the last face has no crop
        assert row[:3] == (face_id, embedding, crop)  # data intact
        assert row[3] == "arcface_112" and np.allclose(json.loads(row[4]), ARCFACE_112)
    assert stored[3][2:] == (None, None, None)  # a face without a crop stays without one
    assert gallery.list_faces(PEOPLE[0])[0].box == [1, 2, 3, 4]
    gallery.close()

    new = key_of(new_pipeline)
    gallery = SqliteGallery.open(tmp_path, new, searchable=False)
    assert gallery.reembed(new_pipeline.embedder.embed, new_pipeline.template, batch=2) == (3, 1)
    gallery.close()

    gallery = SqliteGallery.open(tmp_path, new)
    assert gallery.index.size == 3 and gallery.incompatible == {f"old-model@{'0' * 12}": 1}
    for (name, _, _), (_, _, crop) in zip(photos, rows, strict=True):
        realigned = align_face(decode_crop(crop)[..., ::-1], ARCFACE_112, TEST_150[0])  # the old crop, re-aligned directly
        expected = new_pipeline.embedder.embed(realigned[None])[0]
        assert np.allclose(gallery.subject_embeddings(name)[0], expected, atol=1e-6)
        assert gallery.search(expected, 1)[0].subject_id == name
    gallery.close()


@pytest.mark.data
def test_reembed_new_rows_equals_aligning_the_photo_for_the_new_model(tmp_path, photos, pipeline, new_pipeline):
    gallery = SqliteGallery.open(tmp_path, key_of(pipeline))
    for name, image, _ in photos:
        gallery.create_subject(name, {}, name)
        (found,) = pipeline.run(pipeline.steps(image, chips=True))
        assert found.chip.frame == LOOSE
        gallery.add_faces(name, [NewFace(found.embedding, chip=found.chip)])
    gallery.close()

    new = key_of(new_pipeline)
    gallery = SqliteGallery.open(tmp_path, new, searchable=False)
    seen = []

    def embed(crops):
        seen.extend(crops)
        return new_pipeline.embedder.embed(crops)

    assert gallery.reembed(embed, new_pipeline.template) == (3, 0)
    gallery.close()
    gallery = SqliteGallery.open(tmp_path, new)
    for (name, image, landmarks), crop in zip(photos, seen, strict=True):
        direct = align_face(image, landmarks, TEST_150[0])
        assert mean_abs(crop, direct) < 3.0
        expected = new_pipeline.embedder.embed(direct[None])[0]
        assert float(gallery.subject_embeddings(name)[0] @ expected) > 0.999
        assert gallery.search(expected, 1)[0].subject_id == name
    gallery.close()


@pytest.mark.data
def test_aligned_upload_is_kept_with_its_templates_points(monkeypatch, photos, new_pipeline):
    _, image, landmarks = photos[0]
    crop = align_face(image, landmarks)
    chip = template_chip(crop, "arcface_112")
    assert np.array_equal(chip.align("arcface_112"), crop)
    assert mean_abs(chip.align(TEST_150[0])[30:120, 30:120], align_face(image, landmarks, TEST_150[0])[30:120, 30:120]) < 3.0
    with pytest.raises(ValueError):
        template_chip(crop[:100], "arcface_112")


@pytest.mark.data
def test_migration_is_idempotent(tmp_path, photos):
    _old_gallery(tmp_path, photos)
    for _ in range(2):
        gallery = SqliteGallery.open(tmp_path, OLD)
        assert gallery._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert gallery.counts()["faces"] == 4
        gallery.close()
    columns = _columns(tmp_path / DATABASE)
    assert columns.count("crop_frame") == 1 and columns.count("crop_landmarks") == 1
    fresh = SqliteGallery.open(tmp_path / "fresh", OLD)  # a new database goes through the same steps
    fresh.close()
    assert _columns(tmp_path / "fresh" / DATABASE) == columns


def test_a_newer_schema_is_refused(tmp_path):
    SqliteGallery.open(tmp_path, OLD).close()
    db = sqlite3.connect(tmp_path / DATABASE)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(RuntimeError, match="newer"):
        SqliteGallery.open(tmp_path, OLD)


def test_manifest_refuses_the_loose_frame_as_an_alignment(embedder_manifest):
    data = json.loads(embedder_manifest.read_text())
    Manifest.model_validate({**data, "alignment": "arcface_112"})
    with pytest.raises(ValueError):
        Manifest.model_validate({**data, "alignment": LOOSE})
