"""`facegate gallery duplicates`: the pairs of subjects whose faces /identify would answer as each
other, checked against every face's leave-one-out score computed here by brute force."""

from __future__ import annotations

import json

import numpy as np

from service.core.models.manifest import EmbedderKey, Manifest, OpenSetRows, OpenSetTable
from service.gallery.interface import NewFace
from service.gallery.sqlite import SqliteGallery


def margin(cosines: list[float]) -> float:
    s = sorted(cosines, reverse=True)
    k = min(10, len(s) - 1)
    return s[0] + 0.5 * (s[0] - sum(s[1 : k + 1]) / k)


def test_duplicates_lists_the_pairs_identify_would_confuse(tmp_path, embedder_manifest, cli_env, monkeypatch):
    from service import cli
    from service.core.settings import get_settings

    manifest = Manifest.load(embedder_manifest)
    manifest.open_set = OpenSetTable(
        fpirs=[0.1, 0.01, 0.001],
        tables=[OpenSetRows(faces_per_subject=1, subjects=[10, 1000], thresholds=[[0.30, 0.40, 0.50], [0.35, 0.45, 0.55]], samples=[1, 1])],
    )
    with_table = embedder_manifest.with_name("with-table.json")
    manifest.save(with_table)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((120, 64)).astype(np.float32)
    vectors[7] = vectors[3] + 0.05 * rng.standard_normal(64)  # one person under two ids
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    gallery = SqliteGallery.open(tmp_path, EmbedderKey(manifest.name, manifest.file.sha256, 64))
    for i, vector in enumerate(vectors):
        gallery.create_subject(f"Person {i}", {}, f"p{i}")
        gallery.add_faces(f"p{i}", [NewFace(vector)])
    gallery.close()

    monkeypatch.setenv("FACEGATE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FACEGATE_EMBEDDER", str(with_table))
    get_settings.cache_clear()
    result = cli_env(cli.app, "gallery", "duplicates", "--json", "--limit", "1000")
    assert result.exit_code == 0, result.output
    pairs = [json.loads(line) for line in result.stdout.splitlines()]
    assert {pairs[0]["subject_id"], pairs[0]["other_subject_id"]} == {"p3", "p7"} and pairs[0]["name"] in ("Person 3", "Person 7")
    threshold = pairs[0]["threshold"]
    cosines = vectors @ vectors.T
    expected = {}
    for i in range(120):
        others = [cosines[i, j] for j in range(120) if j != i]
        score = margin(others)
        best = int(np.argmax([cosines[i, j] if j != i else -2 for j in range(120)]))
        if score >= threshold:
            key = tuple(sorted((f"p{i}", f"p{best}")))
            expected[key] = max(expected.get(key, -np.inf), score)
    listed = {tuple(sorted((p["subject_id"], p["other_subject_id"]))): p["score"] for p in pairs}
    assert listed.keys() == expected.keys() and all(abs(listed[k] - expected[k]) < 1e-5 for k in listed)
    assert [p["score"] for p in pairs] == sorted((p["score"] for p in pairs), reverse=True)
    for i in (3, 7, 20):  # one subject's pairs: its face's own (the listing above keeps one face per pair, of either side)
        result = cli_env(cli.app, "gallery", "duplicates", "--json", "--limit", "1000", "--subject", f"p{i}")
        assert result.exit_code == 0, result.output
        own = {(p["subject_id"], p["other_subject_id"]): p["score"] for p in map(json.loads, result.stdout.splitlines())}
        score = margin([cosines[i, j] for j in range(120) if j != i])
        best = int(np.argmax([cosines[i, j] if j != i else -2 for j in range(120)]))
        assert own.keys() == ({(f"p{i}", f"p{best}")} if score >= threshold else set()), own
        assert all(abs(v - score) < 1e-5 for v in own.values())
    assert len({(p["subject_id"], p["other_subject_id"]) for p in pairs} & {("p3", "p7"), ("p7", "p3")}) == 1
    assert cli_env(cli.app, "gallery", "duplicates", "--subject", "ghost").exit_code != 0
