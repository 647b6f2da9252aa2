"""Nothing slow on the event loop (issue 34, defect 3): a body is parsed, validated and checked on a
worker thread, its values are capped before parsing (a flat list is one container), CompreFace's bulk
delete is bounded and one statement, and the embedding routes compute and render off the loop; with
the models in a model host (issue 44), the hand-over of a run and /metrics' question to the host
happen off the loop, and a host outage is refused at once."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import numpy as np
import pytest

from service.api.requests import MAX_JSON_VALUES
from tests.conftest import aligned_crop_png
from tests.polling import wait_until
from tests.service.api.test_routes import error, new_subject


def on_event_loop() -> bool:
    """Whether the caller runs on an asyncio event loop (in its thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def loop_calls(monkeypatch):
    """Wraps functions to record, each time one runs, whether it ran on the event loop."""
    seen: list[tuple[str, bool]] = []

    def watch(module, name: str) -> None:
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            seen.append((name, on_event_loop()))
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    return watch, seen


def test_subject_bodies_are_validated_and_checked_off_the_loop(api, loop_calls):
    from service.api import metadata

    watch, seen = loop_calls
    watch(metadata, "problem")
    assert api.post("/subjects", json={"id": "a", "name": "A", "metadata": {"k": [1, 2, 3]}}).status_code == 201
    assert api.patch("/subjects/a", json={"metadata": {"k": "v"}}).status_code == 200
    assert len(seen) == 4 and not any(on_loop for _, on_loop in seen), seen  # each body's check, and its answer's


def test_a_json_body_of_more_values_than_the_cap_is_refused_before_parsing(api):
    flat = json.dumps({"id": "big", "name": "x", "metadata": {"list": [0] * (MAX_JSON_VALUES + 1)}})
    message = error(api.post("/subjects", content=flat, headers={"content-type": "application/json"}), 400, "invalid_json")
    assert f"more than {MAX_JSON_VALUES} values" in message
    assert api.get("/subjects").json()["total"] == 0


def test_a_metadata_list_under_the_value_cap_is_refused_by_its_size(api):
    message = error(api.post("/subjects", json={"id": "big", "name": "x", "metadata": {"list": [0] * 500_000}}), 422, "invalid_parameters")
    assert "FACEGATE_MAX_METADATA_BYTES" in message


def _faces(api, lfw_faces, count: int) -> list[str]:
    from tests.conftest import LFW_PEOPLE

    new_subject(api, "bush")
    image = lfw_faces[LFW_PEOPLE[0]][0]
    return [str(api.post("/subjects/bush/faces", files={"image": image}).json()["face_id"]) for _ in range(count)]


def test_compreface_bulk_delete_is_bounded_and_one_statement(api, lfw_faces):
    from service.api.compat.compreface import MAX_DELETE_IDS

    ids = _faces(api, lfw_faces, 3)
    too_many = [str(i) for i in range(1, MAX_DELETE_IDS + 2)]
    refused = api.post("/api/v1/recognition/faces/delete", json=too_many)
    assert refused.status_code == 422 and f"at most {MAX_DELETE_IDS}" in refused.json()["message"], refused.text  # CompreFace's shape
    assert len(api.get("/subjects/bush/faces").json()["faces"]) == 3

    statements: list[str] = []
    api.app.state.service.gallery._db.set_trace_callback(statements.append)
    answer = api.post("/api/v1/recognition/faces/delete", json=[ids[0], "999999", ids[2], ids[0]])
    assert answer.status_code == 200, answer.text
    assert answer.json() == [{"image_id": ids[0], "subject": "bush"}, {"image_id": ids[2], "subject": "bush"}]
    assert len([s for s in statements if s.lstrip().upper().startswith("DELETE FROM FACES")]) == 1, statements  # and one change logged
    assert [f["face_id"] for f in api.get("/subjects/bush/faces").json()["faces"]] == [int(ids[1])]


def test_compreface_embedding_routes_compute_off_the_loop(api, loop_calls):
    from service.api.compat import compreface

    watch, seen = loop_calls
    watch(compreface, "_unit")
    dim = api.app.state.service.models.embedder.manifest.embedding_dim
    rows = np.random.default_rng(0).normal(size=(3, dim)).round(6).tolist()
    recognized = api.post("/api/v1/recognition/embeddings/recognize", json={"embeddings": rows})
    assert recognized.status_code == 200 and [r["embedding"] for r in recognized.json()["result"]] == rows
    verified = api.post("/api/v1/verification/embeddings/verify", json={"source": rows[0], "targets": rows})
    assert verified.status_code == 200 and len(verified.json()["result"]) == 3
    assert seen and not any(on_loop for _, on_loop in seen), seen


@pytest.fixture
def hosted_api(api_settings, make_client, tmp_path):
    """An app whose models run in a model host (serving from a thread here), as a worker of
    `facegate serve --workers N` runs them; yields the client and the host."""
    from service.runtime.model_host import SOCKET, ModelHost

    folder = tmp_path / "host"
    folder.mkdir()
    host = ModelHost(api_settings, folder)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    try:
        yield make_client(api_settings.model_copy(update={"model_host": folder / SOCKET, "model_host_shared_memory": 4 << 20})), host
    finally:
        host.close()


def test_hosted_model_runs_and_the_hosts_metrics_are_asked_off_the_loop_and_an_outage_answers_503_at_once(hosted_api, loop_calls):
    """A hosted run copies into shared memory and writes to the host's socket, /metrics asks the host:
    none of it on the loop. With the host gone, an image request is refused before any of it (503
    model_unavailable with Retry-After) and /readyz says why."""
    from service.runtime.hosted_models import HostedModels
    from service.runtime.shm_arena import Arena

    client, host = hosted_api
    watch, seen = loop_calls
    for cls, name in ((HostedModels, "_submit"), (HostedModels, "ask"), (Arena, "put")):
        watch(cls, name)
    image = {"image": base64.b64encode(aligned_crop_png(1)).decode(), "aligned": True}
    assert client.post("/identify", json=image).status_code == 200
    assert client.get("/metrics").status_code == 200
    assert {"_submit", "ask", "put"} <= {name for name, _ in seen} and not any(on_loop for _, on_loop in seen), seen

    host.close()  # every worker dropped, as the host's death drops them
    hosted = client.app.state.service.hosted
    wait_until(lambda: "is down" in (hosted.problem() or ""), "the worker sees its host down")
    del seen[:]
    refused = client.post("/identify", json=image)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_unavailable", refused.text
    assert refused.headers["retry-after"] == "1"
    assert not any(name in ("_submit", "put") for name, _ in seen)  # refused before anything was copied or sent
    ready = client.get("/readyz")
    assert ready.status_code == 503 and any("model host is down" in p["error"] for p in ready.json()["problems"]), ready.text
    assert client.get("/metrics").status_code == 200  # the host's last metrics, at once
    assert not any(on_loop for _, on_loop in seen), seen


def test_ready_workers_files_are_read_and_locked_off_the_loop(api_settings, make_client, loop_calls, tmp_path):
    """A worker of `facegate serve --workers N`: /readyz counts the ready workers' locked files, and the
    worker marks itself ready by locking its own; neither on the loop (a slow disk would stall every request)."""
    from service.runtime.ready_workers import ReadyWorkers

    watch, seen = loop_calls
    watch(ReadyWorkers, "count")
    watch(ReadyWorkers, "mark_ready")
    client = make_client(api_settings.model_copy(update={"ready_workers_dir": tmp_path, "workers": 2}))
    wait_until(lambda: any(name == "mark_ready" for name, _ in seen), "the worker marked itself ready")
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "1 of 2 workers ready" in ready.text, ready.text  # the other worker never started
    assert {"count", "mark_ready"} <= {name for name, _ in seen} and not any(on_loop for _, on_loop in seen), seen
