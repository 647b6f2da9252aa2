"""/identify, /readyz and /metrics on a gallery searched by an approximate FAISS index
(FACEGATE_INDEX): the same answers as the exact index, the index named with its parameters and size,
search latency measured, each query kept for the recall check. Test embedder, real detector on LFW images."""

from __future__ import annotations

from tests.conftest import LFW_PEOPLE
from tests.requirements import importorskip

PEOPLE = LFW_PEOPLE[:3]


def test_identify_on_hnsw_answers_as_the_flat_index_does(api_settings, make_client, lfw_faces):
    answers = {}
    for spec in ("Flat", "HNSW16"):
        settings = api_settings.model_copy(
            update={
                "index": spec,
                "index_search_params": "efSearch=32" if spec != "Flat" else "",
                "data_dir": api_settings.data_dir / spec,
                "index_recall_live": 1.0,
            }
        )
        api = make_client(settings)
        for name in PEOPLE:
            assert api.post("/subjects", json={"id": name, "name": name}).status_code == 201
            assert api.post(f"/subjects/{name}/faces", files={"image": lfw_faces[name][0]}).status_code == 201
        found = [api.post("/identify", files={"image": lfw_faces[name][1]}).json() for name in PEOPLE]
        # each query is kept for the recall check with the decision it was answered with (an exact index keeps none)
        queries, decisions = api.app.state.service.recall.live.taken()
        assert len(decisions) == (0 if spec == "Flat" else 3) and all(d.threshold == found[0]["threshold"] for d in decisions)
        answers[spec] = [
            [(c["subject_id"], round(c["similarity"], 5)) for c in f["candidates"]] + [f["match"] and f["match"]["subject_id"]]
            for f in found
        ]
        index = api.get("/readyz").json()["gallery"]["index"]
        assert index["backend"] == ("faiss-flat" if spec == "Flat" else "faiss-hnsw") and index["size"] == 3 and index["factory"] == spec
        metrics = api.get("/metrics").text
        assert f'facegate_gallery_index_size{{backend="{index["backend"]}",collection="default"}} 3.0' in metrics
        assert "facegate_gallery_search_seconds_count 3.0" in metrics
    assert answers["HNSW16"] == answers["Flat"]


def test_milvus_backend_in_readyz_metrics_and_503_when_unreachable(api_settings, make_client, lfw_faces, tmp_path):
    importorskip("milvus_lite")
    api = make_client(api_settings.model_copy(update={"milvus_uri": str(tmp_path / "milvus.db"), "milvus_index": "FLAT"}))
    name = PEOPLE[0]
    assert api.post("/subjects", json={"id": name, "name": name}).status_code == 201
    assert api.post(f"/subjects/{name}/faces", files={"image": lfw_faces[name][0]}).status_code == 201
    found = api.post("/identify", files={"image": lfw_faces[name][1]}).json()
    assert found["candidates"][0]["subject_id"] == name
    index = api.get("/readyz").json()["gallery"]["index"]
    assert index["backend"] == "milvus" and index["size"] == 1 and index["consistency"] == "Strong"
    assert 'facegate_gallery_index_size{backend="milvus",collection="default"} 1.0' in api.get("/metrics").text
    milvus = api.app.state.service.gallery.index
    uri, milvus.uri, milvus._client = milvus.uri, "http://127.0.0.1:1", None  # Milvus goes away
    for response in (
        api.post("/identify", files={"image": lfw_faces[name][1]}),
        api.post(f"/subjects/{name}/faces", files={"image": lfw_faces[name][1]}),
    ):
        assert response.status_code == 503 and response.json()["error"]["code"] == "gallery_unavailable"
    milvus.uri = uri  # back: answered again, and the refused enrollment left nothing behind
    assert api.post("/identify", files={"image": lfw_faces[name][1]}).status_code == 200
    assert len(api.get(f"/subjects/{name}/faces").json()["faces"]) == 1


def test_readyz_and_metrics_report_the_index_recall_and_a_low_one_as_a_problem(api_settings, make_client, embedder_manifest):
    """A gallery of synthetic faces (clustered as faces are) behind an IVF index searched with
    nprobe=1: the start-up check measures its recall@1 in the background (0.92 here), widens the
    search until FACEGATE_MIN_INDEX_RECALL is met, and /readyz shows it, with no problem; /metrics
    exports it. The defaults meet it as they are. Coarse codes (PQ4x4) cannot meet 1.0 at any
    nprobe: /readyz lists a problem and says answers come from an exact copy (still ready). The
    figure comes with its 95 % interval from the sampling alone."""
    from service.core.models.manifest import EmbedderKey, Manifest
    from service.gallery.interface import NewFace
    from service.gallery.recall import wilson
    from service.gallery.sqlite import SqliteGallery
    from tests.service.gallery.test_recall import clustered, wait_for

    key = EmbedderKey.of(Manifest.load(embedder_manifest))
    faces = clustered(300, 10, dim=key.dim)
    store = SqliteGallery.open(api_settings.data_dir, key, searchable=False)
    for p in range(300):
        store.create_subject(f"p{p}", {}, f"p{p}")
        store.add_faces(f"p{p}", [NewFace(v) for v in faces[p * 10 : (p + 1) * 10]])
    store.close()
    runs = [("IVF64,Flat", "nprobe=1", 0.99), ("IVF64,Flat", "", 0.99), ("IVF64,PQ4x4", "nprobe=1", 1.0)]
    for spec, params, minimum in runs:
        api = make_client(api_settings.model_copy(update={"index": spec, "index_search_params": params, "min_index_recall": minimum}))
        assert wait_for(lambda: api.get("/readyz").json()["gallery"]["index"]["recall"]["recall_at_1"] is not None)
        ready = api.get("/readyz")
        index, problems = ready.json()["gallery"]["index"], ready.json()["problems"]
        recall = index["recall"]
        # mated: the enrolled faces its IVF lists were trained without (a face of each of the 300 people), the rest near copies
        assert ready.status_code == 200 and recall["queries"] == 1000 and recall["mated_queries"] == 300 and recall["minimum"] == minimum
        metrics = api.get("/metrics").text
        assert f'facegate_gallery_index_recall{{collection="default"}} {recall["recall_at_1"]}' in metrics
        assert recall["search_params"] == index["search_params"] != ""
        low, high = recall["interval"]  # the figure's 95 % interval from its 1,000 queries
        assert [low, high] == list(wilson(round(recall["recall_at_1"] * 1000), 1000)) and low <= recall["recall_at_1"] <= high
        if spec.endswith("PQ4x4"):
            assert recall["recall_at_1"] < 1 and recall["answers"] == index["answers"] == "exact" and index["search_params"] == "nprobe=64"
            assert [p["model"] for p in problems] == ["gallery index"] and "answered from an exact copy" in problems[0]["error"]
        elif params:
            assert index["search_params_source"] == "widened" and index["widened_from"] == "nprobe=1"
            assert recall["recall_at_1"] >= 0.99 and recall["answers"] == "index" and problems == []
        else:
            assert index["search_params_source"] == "default" and recall["recall_at_1"] >= 0.99 and problems == []
