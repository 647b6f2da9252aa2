"""The HTTP API: `create_app()` is a uvicorn factory (`service.api.app:create_app`, as `facegate
serve` runs it) and takes explicit Settings in tests. Models and the gallery are opened in the
lifespan, closed on shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service import __version__
from service.api import access_log, compat, console, docs_ui, error_handlers
from service.api.admission import Admission
from service.api.auth import ApiKeys
from service.api.compat import deepstack
from service.api.deps import Service
from service.api.middleware import PUBLIC_PATHS, ApiKeyAuth, BodyLimit, CancelOnDisconnect, NoteWork, RequestMetrics
from service.api.routes import ROUTERS
from service.budget import BodyBudget
from service.core.models.model_set import load_models
from service.core.pipeline import FacePipeline
from service.core.settings import Settings
from service.engine import Engine
from service.gallery.collection_names import DEFAULT
from service.gallery.collections import Collection, Collections
from service.gallery.factory import open_gallery, shared_connections
from service.gallery.index import near_copy_of, set_search_threads
from service.gallery.recall import RecallCheck
from service.gallery.stats import GalleryStats
from service.metrics import Metrics
from service.readiness import Readiness
from service.runtime.decode_workers import DecodeWorkers
from service.runtime.heap import IdleTrim
from service.runtime.hosted_models import HostedModels
from service.runtime.ready_workers import ReadyWorkers

if TYPE_CHECKING:  # psycopg is an extra: PostgreSQL's store is imported only where it is configured
    from service.gallery.postgres import PostgresGallery
    from service.gallery.sqlite import SqliteGallery

log = logging.getLogger("facegate.app")

DESCRIPTION = """Self-hosted face verification and identification.

Image parameters take a multipart file part, or a base64 string under the same name in a JSON body.
Every error answers `{"error": {"code": "...", "message": "..."}}`. When API keys are configured,
every route but /healthz and /readyz needs an `X-API-Key` header."""


READY_POLL = 0.2  # seconds between a worker's looks at its own readiness, until it is ready (then counted for /readyz)
ANONYMOUS_WARNING = (
    "NO API KEYS ARE CONFIGURED: every route, the gallery's DELETE included, answers anyone who can reach "
    "this port. Set FACEGATE_API_KEYS or FACEGATE_API_KEYS_FILE (docs/api.md, Authentication)."
)


class FacegateApp(FastAPI):
    def openapi(self) -> dict:
        """FastAPI's schema, with the X-API-Key scheme declared on every route the key middleware guards."""
        if self.openapi_schema is None:
            schema = get_openapi(title=self.title, version=self.version, description=self.description, routes=self.routes)
            schema.setdefault("components", {})["securitySchemes"] = {"ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}
            for path, operations in schema["paths"].items():
                if path not in PUBLIC_PATHS:
                    for operation in operations.values():
                        operation["security"] = [{"ApiKey": []}]
            self.openapi_schema = schema
        return self.openapi_schema


def _on_signal(signum: int, handler) -> bool:
    """Run `handler` on the event loop at `signum`; False where signals cannot be handled here
    (not the main thread, as under a test client)."""
    try:
        asyncio.get_running_loop().add_signal_handler(signum, handler)
    except (RuntimeError, ValueError, NotImplementedError):
        return False
    return True


def _recall_once_loaded(gallery: SqliteGallery | PostgresGallery, recall: RecallCheck) -> None:
    """Start the recall check once the index the gallery builds in the background is built (not when
    the gallery was closed first); it follows the gallery's index from then on."""
    if gallery.wait_loaded():
        recall.start()


async def _mark_once_ready(service: Service, galleries: Collections, workers: ReadyWorkers) -> None:
    """Count this worker among those that answer once it can (warmed up, every start-up collection's index built)."""
    while not (service.readiness.ready and not galleries.loading()):
        await asyncio.sleep(READY_POLL)
    await asyncio.to_thread(workers.mark_ready)  # file operations: off the loop


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics(hosted_models=settings.model_host is not None)
    keys = ApiKeys.from_settings(settings)
    access_log.install()
    idle = IdleTrim(settings.idle_trim_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        set_search_threads(settings.search_threads)
        hosted = None
        if settings.model_host is not None:  # a worker of `facegate serve --workers N`: the models run in its model host
            hosted = await asyncio.to_thread(HostedModels, settings, settings.model_host, settings.model_host_shared_memory)
            models = hosted.model_set(settings)
        else:
            models = load_models(settings)
        for problem in models.problems:
            log.error("%s %r is unavailable: %s", problem.model, problem.name, problem.error)
        readiness = Readiness(models, settings.default_far)
        if hosted is not None:
            readiness.host_problem = hosted.problem
        decoders = DecodeWorkers.for_settings(settings) if readiness.loaded else None
        pipeline = FacePipeline(settings, models, decoders) if decoders is not None else None
        engine = Engine(settings, pipeline, metrics, hosted) if pipeline is not None else None
        if engine:
            readiness.serving = engine.describe
            # In the background: /healthz answers meanwhile, /readyz and image routes say 503 until done;
            # or before the port opens (uvicorn binds it after the lifespan's start-up).
            if settings.warm_up_before_listening:
                await asyncio.to_thread(engine.warm_up, readiness.warmup_done)
            else:
                engine.start_warm_up(readiness.warmup_done)
        embedder = engine.pipeline.embedder if engine else None
        near_copy = near_copy_of(embedder.manifest if embedder else None)
        connections = shared_connections(settings)  # PostgreSQL: one pool and one LISTEN connection for every collection

        def open_collection(name: str) -> Collection:
            # the index and guard are built on the gallery's own thread: the port listens meanwhile (/readyz 503 "loading"),
            # unless a process that accepts a connection must be ready (FACEGATE_WARM_UP_BEFORE_LISTENING)
            background = not settings.warm_up_before_listening
            gallery = open_gallery(
                settings, models.embedder_key, background=background, collection=name, connections=connections, near_copy=near_copy
            )
            recall = RecallCheck.from_settings(settings, gallery, lambda: gallery.index, embedder)
            # the recall check measures the index once there is one
            started = threading.Thread(
                target=_recall_once_loaded, args=(gallery, recall), name=f"facegate-recall-start-{name}", daemon=True
            )
            started.start()
            return Collection(name, gallery, GalleryStats(gallery), recall, started)

        galleries = Collections(open_collection)
        # off the loop, one after another (their migrations too); those a reloaded key file names open in the background
        first = await asyncio.to_thread(galleries.open, DEFAULT)  # what a caller without a key (/readyz, anonymous mode) sees
        for name in sorted(keys.collections):
            await asyncio.to_thread(galleries.open, name)
        workers = ReadyWorkers.for_settings(settings)  # a worker of several: /readyz answers for them all
        service = app.state.service = Service(
            settings,
            metrics,
            keys,
            models,
            readiness,
            engine,
            first.gallery,
            first.stats,
            first.recall,
            hosted,
            workers,
            DEFAULT,
            galleries,
        )
        marked = asyncio.create_task(_mark_once_ready(service, galleries, workers)) if workers is not None else None
        log.info("facegate models loaded=%s, api keys %s", readiness.loaded, "on" if keys.enabled else "off")
        if not keys.enabled:
            log.warning(ANONYMOUS_WARNING)
        reload_on_hangup = _on_signal(signal.SIGHUP, service.reload_keys)  # key rotation without a restart
        if decoders is not None:
            idle.also.append(decoders.give_back)
        idle.start()
        try:
            yield
        finally:
            idle.stop()
            if marked is not None:
                marked.cancel()
            if workers is not None:  # no longer counted among the workers that answer
                workers.close()
            if reload_on_hangup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            if engine:
                engine.close()
            elif hosted:
                hosted.close()
            await asyncio.to_thread(galleries.close)
            if connections is not None:  # once every collection is closed
                await asyncio.to_thread(connections.close)
            del app.state.service  # models, index, pools: freed now, whoever still holds the app object

    app = FacegateApp(title="facegate", version=__version__, description=DESCRIPTION, lifespan=lifespan, docs_url=None, redoc_url=None)
    error_handlers.install(app, compat.ERROR_SHAPES)
    docs_ui.install(app)
    console.install(app)
    for router in ROUTERS + compat.ROUTERS:
        app.include_router(router)
    # add_middleware wraps: the last added runs first (metrics see every answer, 401 and 413 included).
    app.add_middleware(CancelOnDisconnect)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes, timeout=settings.body_timeout, min_rate=settings.body_min_rate)
    app.add_middleware(
        Admission,
        limit=settings.max_inflight_requests,
        unauthenticated=settings.max_unauthenticated_requests,
        per_client=settings.max_unauthenticated_per_client,
        bodies=BodyBudget(settings.max_body_megabytes, settings.decode_wait),
    )
    app.add_middleware(ApiKeyAuth, keys=keys, body_key_paths=deepstack.PATHS, refusals=compat.KEY_REFUSALS)
    app.add_middleware(NoteWork, idle=idle)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app
