"""Prometheus metrics, in a registry per app so several apps (tests) never share counters."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SEARCH_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
MODEL_RUN_METRICS = (
    "facegate_embed_batch_size",
    "facegate_embed_queue_wait_seconds",
    "facegate_faces_embedded",
    "facegate_detect_batch_size",
    "facegate_detect_queue_wait_seconds",
)


class HostedModelRuns(Collector):
    """The model host's model-run metrics (batch sizes, queue waits, faces embedded) as last fetched
    from it: with a model host the models run there, so a worker has none of its own."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> list[Metric]:
        return [f for f in self.families if f.name in MODEL_RUN_METRICS]


class Metrics:
    def __init__(self, hosted_models: bool = False) -> None:
        """`hosted_models`: the models run in a model host, whose model-run metrics `model_host` reports."""
        self.registry = CollectorRegistry()
        self.model_host: HostedModelRuns | None = HostedModelRuns() if hosted_models else None
        r = self.registry
        m = None if hosted_models else r  # this process's model-run metrics, registered only where the models run
        self.requests = Counter(
            "facegate_requests", "HTTP requests by route template, method and status.", ["route", "method", "status"], registry=r
        )
        self.latency = Histogram(
            "facegate_request_seconds", "HTTP request latency.", ["route", "method"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram("facegate_embed_batch_size", "Faces per embedder run.", buckets=BATCH_BUCKETS, registry=m)
        self.queue_wait = Histogram(
            "facegate_embed_queue_wait_seconds", "Time faces waited for their embedder run.", buckets=WAIT_BUCKETS, registry=m
        )
        self.faces_embedded = Counter("facegate_faces_embedded", "Faces embedded.", registry=m)
        self.detect_batch_size = Histogram("facegate_detect_batch_size", "Images per detector run.", buckets=BATCH_BUCKETS, registry=m)
        self.detect_queue_wait = Histogram(
            "facegate_detect_queue_wait_seconds", "Time images waited for their detector run.", buckets=WAIT_BUCKETS, registry=m
        )
        if self.model_host is not None:
            r.register(self.model_host)
        self.gallery_subjects = Gauge("facegate_gallery_subjects", "Subjects in the gallery.", ["collection"], registry=r)
        self.gallery_faces = Gauge("facegate_gallery_faces", "Faces in the gallery.", ["collection", "searchable"], registry=r)
        self.gallery_up = Gauge(
            "facegate_gallery_up",
            "1 when the gallery's database answered this scrape in time, else 0 (the gauges keep their last values).",
            ["collection"],
            registry=r,
        )
        self.replicated = False  # PostgreSQL: the replication gauges are set
        self.gallery_index_size = Gauge(
            "facegate_gallery_index_size", "Faces in the vector index searches run on, by backend.", ["collection", "backend"], registry=r
        )
        self.gallery_search = Histogram(
            "facegate_gallery_search_seconds",
            "Gallery search latency per face (index search + exact re-scoring).",
            buckets=SEARCH_BUCKETS,
            registry=r,
        )
        self.gallery_applied = Gauge(
            "facegate_gallery_applied_sequence",
            "Last gallery change this replica's index applied (PostgreSQL only).",
            ["collection"],
            registry=r,
        )
        self.gallery_lag = Gauge(
            "facegate_gallery_sync_lag",
            "Gallery changes committed that this replica's index has not applied yet (PostgreSQL only).",
            ["collection"],
            registry=r,
        )

        self.index_recall = Gauge(
            "facegate_gallery_index_recall",
            "recall@1 of the vector index the last recall check measured (1 for an exact index; NaN before the first check).",
            ["collection"],
            registry=r,
        )
        self.index_recall_checked = Gauge(
            "facegate_gallery_index_recall_checked_timestamp_seconds",
            "When the index's recall was last measured (Unix time).",
            ["collection"],
            registry=r,
        )

    def embedder_ran(self, faces: int) -> None:
        """One embedder run of `faces` faces (batched or not)."""
        self.batch_size.observe(faces)
        self.faces_embedded.inc(faces)

    def model_ran(self, role: str, rows: int) -> None:
        """One batched run of the `role` model (embedder or detector) over `rows` inputs."""
        if role == "embedder":
            self.embedder_ran(rows)
        else:
            self.detect_batch_size.observe(rows)

    def waited(self, role: str, seconds: float) -> None:
        (self.queue_wait if role == "embedder" else self.detect_queue_wait).observe(seconds)

    def observe_gallery(self, snapshot, check, collection: str) -> None:
        """Set the gallery gauges, labelled `collection`, from a `service.gallery.stats.Snapshot` (read
        for each scrape, never waiting on the database for long: the last known values, NaN while none
        is known) and a `service.gallery.recall.RecallCheck` (its last result). The caller's collection
        only: another's series are dropped first, so a key never reads another collection's counts (the
        caller renders the registry before the loop runs anything else)."""
        for gauge in self.gallery_gauges:
            gauge.clear()
        counts, replication = snapshot.counts or {}, snapshot.replication or {}
        self.gallery_up.labels(collection).set(1.0 if snapshot.fresh else 0.0)
        self.gallery_subjects.labels(collection).set(counts.get("subjects", math.nan))
        self.gallery_faces.labels(collection, "true").set(counts.get("searchable_faces", math.nan))
        self.gallery_faces.labels(collection, "false").set(counts.get("incompatible_faces", math.nan))
        if snapshot.index is not None:
            self.gallery_index_size.labels(collection, snapshot.index["backend"]).set(
                snapshot.index.get("size", math.nan) if snapshot.fresh else math.nan
            )
        if snapshot.replication is not None or self.replicated:
            self.replicated = True
            self.gallery_applied.labels(collection).set(replication.get("applied_sequence", math.nan))
            self.gallery_lag.labels(collection).set(replication.get("lag", math.nan) if snapshot.fresh else math.nan)
        self.index_recall.labels(collection).set(check.recall())
        self.index_recall_checked.labels(collection).set(check.last.checked_at if check.last else math.nan)

    @property
    def gallery_gauges(self) -> tuple[Gauge, ...]:
        return (
            self.gallery_up,
            self.gallery_subjects,
            self.gallery_faces,
            self.gallery_index_size,
            self.gallery_applied,
            self.gallery_lag,
            self.index_recall,
            self.index_recall_checked,
        )
