"""Collections under concurrent writes (issue 50), against a real `facegate serve --workers 2`: two
collections enrolled and searched at once through both workers (each worker keeps a state per
collection, following the shared file's change log) never answer a subject of the other collection."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.chaos.server import facegate_serve
from tests.conftest import aligned_crop_png
from tests.polling import wait_until

pytestmark = pytest.mark.slow

KEYS = {"home": "home-key", "office": "office-key"}
ROUNDS = 8


def test_two_collections_written_at_once_never_answer_across(tmp_path, model_cache, embedder_manifest):
    keys = tmp_path / "keys"
    keys.write_text("".join(f"{key} collection={name}\n" for name, key in KEYS.items()))
    env = {
        "FACEGATE_API_KEYS_FILE": str(keys),
        "FACEGATE_DATA_DIR": str(tmp_path / "gallery"),
        "FACEGATE_MODEL_CACHE": str(model_cache),
        "FACEGATE_EMBEDDER": str(embedder_manifest),
        "FACEGATE_WORKERS": "2",
    }
    with facegate_serve(env, tmp_path / "server.log", ready="/readyz", start_timeout=120) as (url, _, process):
        wait_until(lambda: httpx.get(f"{url}/readyz", headers={"X-API-Key": "home-key"}, timeout=5).status_code == 200, "ready", 60)

        def work(collection: str, lane: int) -> list[str]:
            """Enroll a subject a round (the same crops in both collections: the same faces) and
            identify each new face at once, perhaps through the other worker; the subjects answered
            that are not this collection's."""
            headers, wrong = {"X-API-Key": KEYS[collection]}, []
            with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
                for n in range(ROUNDS):
                    seed = lane * 100 + n
                    subject = f"{collection}-{seed}"
                    assert client.post("/subjects", json={"id": subject, "name": subject}).status_code == 201
                    added = client.post(f"/subjects/{subject}/faces", files={"image": aligned_crop_png(seed)}, data={"aligned": "true"})
                    assert added.status_code == 201, added.text
                    crop = base64.b64encode(aligned_crop_png(seed)).decode()
                    found = client.post("/identify", json={"image": crop, "aligned": True, "top_k": 10})
                    assert found.status_code == 200, found.text
                    wrong += [c["subject_id"] for c in found.json()["candidates"] if not c["subject_id"].startswith(collection)]
            return wrong

        with ThreadPoolExecutor(4) as pool:
            lanes = [pool.submit(work, collection, lane) for lane in (1, 2) for collection in KEYS]
            wrong = [subject for lane in lanes for subject in lane.result()]
        assert not wrong, wrong[:10]
        for collection, key in KEYS.items():
            listed = httpx.get(f"{url}/subjects", params={"limit": 100}, headers={"X-API-Key": key}, timeout=10).json()
            assert listed["total"] == 2 * ROUNDS and all(s["id"].startswith(collection) for s in listed["subjects"])
