"""What routes share: the process-wide service objects, built in the app's lifespan, as one
`ServiceDep` dependency."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Annotated

import numpy as np
from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant

from service.api.auth import ApiKeys
from service.api.schemas import SUBJECT_ID_PATTERN
from service.core.decision import Decision
from service.core.errors import GalleryLoading, InvalidParameters, SubjectNotFound
from service.core.models.manifest import Manifest
from service.core.models.model_set import ModelSet
from service.core.settings import Settings
from service.engine import Engine
from service.gallery import templates
from service.gallery.collection_names import COLLECTION, DEFAULT
from service.gallery.collections import Collections
from service.gallery.interface import Candidate, GalleryStore
from service.gallery.recall import RecallCheck
from service.gallery.stats import GalleryStats
from service.metrics import Metrics
from service.readiness import Readiness
from service.runtime.hosted_models import HostedModels
from service.runtime.ready_workers import ReadyWorkers


@dataclass(frozen=True)
class Ready:
    """What an image route runs on, neither of them None: `Service.ready()` hands it out only once
    readiness.require() has passed."""

    engine: Engine
    manifest: Manifest  # the embedder's


@dataclass
class Service:
    settings: Settings
    metrics: Metrics
    keys: ApiKeys
    models: ModelSet
    readiness: Readiness
    engine: Engine | None  # None unless both models loaded: routes reach it only past readiness.require()
    gallery: GalleryStore
    gallery_stats: GalleryStats  # counts for /readyz and /metrics, which never wait on the database
    recall: RecallCheck  # the index's measured recall@1, for /readyz and /metrics
    hosted: HostedModels | None = None  # the model host the models run in (`facegate serve --workers N`), if any
    workers: ReadyWorkers | None = None  # the workers of `facegate serve --workers N` that are ready, for /readyz
    collection: str = DEFAULT  # whose gallery, gallery_stats and recall these are: the caller's (get_service)
    collections: Collections | None = None  # every collection's, opened on first use

    @contextmanager
    def scoped(self, collection: str) -> Iterator[Service]:
        """This service as a caller of `collection` sees it: that collection's gallery, counts and
        recall, kept open while the block runs (a reload that retires it closes it after)."""
        if collection == self.collection or self.collections is None:
            yield self
            return
        with self.collections.lease(collection) as state:
            yield replace(self, collection=collection, gallery=state.gallery, gallery_stats=state.stats, recall=state.recall)

    def reload_keys(self) -> None:
        """What SIGHUP runs: the key file read again, the collections it names first opened in the
        background (never on the event loop; their requests answer 503 gallery_loading meanwhile),
        and those it no longer names closed once no request uses them."""
        self.keys.reload()
        if self.collections is not None:
            self.collections.retain(self.keys.collections)

    def ready(self) -> Ready:
        """The engine and the embedder's manifest, or readiness.require()'s 503."""
        self.readiness.require()
        # require() passed: both models are loaded, so the lifespan built the engine
        assert self.engine is not None and self.models.embedder is not None
        return Ready(self.engine, self.models.embedder.manifest)

    def search(self, embedding: np.ndarray, top_k: int, decision: Decision | None = None) -> list[Candidate]:
        """The gallery's top_k subjects for one face, against their best faces or (a decision on the
        mean's rows) their means, timed into facegate_gallery_search_seconds. With the identification's
        `decision`, the face is offered to the recall check's live sample."""
        with self.metrics.gallery_search.time():
            found = templates.search(self.gallery, embedding, top_k, decision)
        if decision is not None:
            self.recall.offer(embedding, decision)  # a seeded share, searched again exactly on the check's thread
        return found


def _scoped(request: Request) -> AbstractContextManager[Service]:
    return request.app.state.service.scoped(request.scope.get(COLLECTION) or DEFAULT)


async def get_service(request: Request) -> AsyncIterator[Service]:
    """The service scoped to the caller's collection (its key's, set by ApiKeyAuth or the DeepStack
    route; `default` for a caller without a key): every route sees and changes that gallery only,
    leased until the request ends. On the loop: no thread hop per request (the lease takes a lock only)."""
    with _scoped(request) as service:
        yield service


ServiceDep = Annotated[Service, Depends(get_service)]


async def get_service_if_open(request: Request) -> AsyncIterator[Service | None]:
    """/readyz's: the caller's service, or None while its collection is still being opened (a
    readiness report says so, where every other route answers 503 gallery_loading)."""
    with ExitStack() as lease:
        try:
            service: Service | None = lease.enter_context(_scoped(request))
        except GalleryLoading:
            service = None
        yield service


ServiceIfOpenDep = Annotated[Service | None, Depends(get_service_if_open)]


def subject_id_path(subject_id: str) -> str:
    """One check of a path's subject id for both stores, before either is asked: an id the
    pattern refuses (a NUL byte, 10k characters) names no subject, so 404 on SQLite and PostgreSQL
    alike (PostgreSQL refused NUL with a 500)."""
    if not re.fullmatch(SUBJECT_ID_PATTERN, subject_id):
        raise SubjectNotFound(f"no subject with id {subject_id[:140]!r}")
    return subject_id


SubjectIdPath = Annotated[str, Depends(subject_id_path)]


def strict_query(request: Request) -> None:
    """Refuses a query parameter the matched route does not declare, or one given twice: FastAPI
    ignores the first and keeps the last of the second, so a typo (`limt=5`) or a conflicting
    repeat (`limit=1&limit=1000`) would silently answer something the client did not ask for."""
    declared = _query_names(request.scope["route"].dependant)
    for name in dict.fromkeys(request.query_params.keys()):
        if name not in declared:
            takes = ", ".join(sorted(declared)) or "none"
            raise InvalidParameters(f"unknown query parameter {name[:64]!r} (this route takes: {takes})")
        if len(request.query_params.getlist(name)) > 1:
            raise InvalidParameters(f"query parameter {name!r} is given more than once")


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route declares, its dependencies' included."""
    return {param.alias for param in dependant.query_params}.union(*(_query_names(d) for d in dependant.dependencies))


StrictQuery = Depends(strict_query)
