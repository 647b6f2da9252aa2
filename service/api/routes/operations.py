"""Operations: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
from contextlib import suppress

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from service.api.deps import Service, ServiceDep, ServiceIfOpenDep
from service.api.schemas import error_responses
from service.gallery.collection_names import COLLECTION, DEFAULT

router = APIRouter(tags=["operations"])


@router.get("/healthz")
@router.head("/healthz", include_in_schema=False)  # as load balancers probe
async def healthz() -> dict:
    """The process is alive (says nothing about models). On the event loop, not a worker thread:
    it answers while image work or an unreachable database holds every thread."""
    return {"status": "ok"}


@router.head("/readyz", include_in_schema=False)
@router.get(
    "/readyz",
    responses={503: {"description": "Not ready: `problems` names each missing model (or the gallery index still loading) and the fix."}},
)
async def readyz(request: Request, scoped: ServiceIfOpenDep) -> JSONResponse:
    """Models loaded (names, sha256, active onnxruntime providers), gallery size, the vector index (`gallery.index`:
    backend such as faiss-flat, faiss-hnsw, faiss-ivf or milvus, its parameters, size and measured recall@1, with a
    problem listed while that is under FACEGATE_MIN_INDEX_RECALL) and, on PostgreSQL, the change this
    replica applied last vs the database's (`gallery.replication`); 503 until the embedder is usable.
    The gallery is the caller's collection (`collection`: its key's; `default` without a key); one still
    being opened (a reloaded key file's) is reported loading, with no counts yet.
    With API keys configured, a caller without a valid X-API-Key gets `{"ready": …}` only (no counts, no model)."""
    service: Service = scoped or request.app.state.service  # the host's models and workers; the caller's gallery once open
    collection = scoped.collection if scoped is not None else request.scope.get(COLLECTION) or DEFAULT
    # the index and guard still being built at start-up (the port listens meanwhile), or the collection still opening
    loading = scoped is None or scoped.gallery.loading
    # the host's other start-up collections: a load balancer's /readyz (no key: default) answers for every key's
    others = [name for name in service.collections.loading() if name != collection] if service.collections else []
    workers = service.workers  # another worker of this host not ready yet: its lock file, read off the loop
    starting = await asyncio.to_thread(workers.problem) if workers is not None else None
    ready = service.readiness.ready and not loading and not others and starting is None
    status = 200 if ready else 503
    if service.keys.enabled and not service.keys.check(request.headers.get("x-api-key")):
        return JSONResponse({"ready": ready}, status_code=status)
    report = service.readiness.report()
    report["ready"] = ready
    report["collection"] = collection  # the caller's key's: the gallery counted below
    if loading:
        report["problems"].append(
            {
                "model": "gallery index",
                "name": "loading",
                "error": "loading: the gallery's index and open-set guard are being built; searches answer 503 gallery_loading meanwhile",
                "fix": "wait: /readyz answers 200 once they are built (docs/sizing.md)",
            }
        )
    if others:
        report["problems"].append(
            {
                "model": "gallery index",
                "name": "loading",
                "error": f"loading: the index and open-set guard of collection(s) {', '.join(others)} are being built",
                "fix": "wait: /readyz answers 200 once every collection the keys named at start-up is built (docs/sizing.md)",
            }
        )
    if starting is not None:
        report["problems"].append(
            {
                "model": "workers",
                "name": "facegate serve",
                "error": starting,
                "fix": "wait: /readyz answers 200 once every worker is ready; if one never is, its log says why",
            }
        )
    report["gallery"] = await _gallery_report(scoped) if scoped is not None else {**dict.fromkeys(GALLERY_KEYS), "loading": True}
    report["problems"] += scoped.recall.problems() if scoped is not None else []  # a low recall is reported, not made unready
    return JSONResponse(report, status_code=status)


GALLERY_KEYS = ("subjects", "faces", "searchable_faces", "incompatible_faces", "incompatible_models", "index")


async def _gallery_report(service: Service) -> dict:
    """The caller's gallery in /readyz: its counts, the index and its recall, and replication."""
    stats = await service.gallery_stats.snapshot()  # never waits long on the database
    report = dict(stats.counts or dict.fromkeys(GALLERY_KEYS[:4]))
    report["incompatible_models"] = service.gallery.incompatible
    report["loading"] = service.gallery.loading
    report["index"] = stats.index and {**stats.index, "recall": service.recall.report()}  # backend, parameters, size, recall@1
    if stats.replication is not None:  # PostgreSQL: this replica's applied change vs the database's
        report["replication"] = stats.replication
    if not stats.fresh:  # the database did not answer in time: the last known counts (null if none)
        report["stale"] = True
    return report


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, **error_responses(401)})
async def metrics(service: ServiceDep) -> Response:
    """Prometheus text format: requests by route and status, latency, batch sizes, queue wait, gallery size
    (the last known while the database does not answer: `facegate_gallery_up` 0), the index's measured recall@1."""
    gallery = await service.gallery_stats.snapshot()
    if service.hosted is not None and service.metrics.model_host is not None:  # the model-run metrics are the host's
        with suppress(Exception):  # a host that does not answer in time: the last ones fetched
            hosted = service.hosted  # asked off the loop (a write to its socket), the whole question bounded
            asked = asyncio.to_thread(lambda: hosted.ask("metrics").result(2.0))
            service.metrics.model_host.families = await asyncio.wait_for(asked, 2.5)
    # no await from here: another scrape cannot set its collection's gauges in between
    service.metrics.observe_gallery(gallery, service.recall, service.collection)
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
