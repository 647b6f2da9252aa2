"""Milvus as the vector index every replica shares (FACEGATE_MILVUS_URI: a Milvus server, or a local
file for Milvus Lite). The store (SQLite or PostgreSQL) stays the system of record; Milvus holds
only (face id, embedding, facegate collection), one Milvus collection per embedder, so no replica
keeps a copy or loads a snapshot at start-up. facegate's collections (collections.py) share it: the
`collection` field is its partition key, each facegate collection's handle writes its name and
searches, counts and lists with a filter on it, so Milvus searches that collection's partition only.
A Milvus collection made before facegate had collections has no such field: it serves `default`
alone (drop it and run `facegate gallery sync-index` to serve several).

Consistency: searches run at the configured Milvus consistency level (Strong by default: a search
waits until every write acknowledged before it is visible, so a 2xx enrollment on any replica is
searchable on every replica at once). Writes: a face is upserted into Milvus inside its store
transaction, before the commit — Milvus unreachable means the enrollment is rolled back and
answered 503, nothing half done. A delete commits in the store first and is then removed from
Milvus; if Milvus cannot be reached then, the vector stays behind but is never answered: every
candidate is looked up in the store (`best_subjects`), which no longer has it.

Index and search parameters: a collection facegate creates gets FACEGATE_MILVUS_INDEX_PARAMS, or
for IVF and HNSW types the defaults below; searches use FACEGATE_MILVUS_SEARCH_PARAMS, or the same
nprobe / ef facegate gives a FAISS index of that kind and size (index.py), from the index the
collection really has (an existing collection keeps its own). The recall check (recall.py)
measures what they give.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from service.core.errors import GalleryUnavailable
from service.gallery.collection_names import DEFAULT
from service.gallery.index import MAX_EF_SEARCH, TARGET_RECALL, IndexConfig, default_ef_search, default_nprobe
from service.gallery.interface import GalleryStore

log = logging.getLogger("facegate.gallery.milvus")

PARTITION_FIELD = "collection"  # facegate's collection: the partition key
UPSERT_BATCH = 5_000  # rows per upsert: well under Milvus's gRPC message limit at 512-d
MILVUS_NLIST = 1024  # IVF lists of a collection facegate creates (Milvus's own default, 128, is for small segments)
# HNSW graph of a collection facegate creates: FAISS's HNSW32 links (what the default ef was measured
# on, with a smaller efConstruction of 40), built more carefully, which only raises recall at a given ef
MILVUS_HNSW = {"M": 32, "efConstruction": 200}


def default_index_params(index_type: str, dim: int) -> dict[str, Any]:
    """Build parameters of a new collection when FACEGATE_MILVUS_INDEX_PARAMS is empty."""
    kind = index_type.upper()
    if kind.startswith("IVF"):
        return {"nlist": MILVUS_NLIST} | ({"m": dim // 4, "nbits": 8} if kind == "IVF_PQ" and dim % 4 == 0 else {})
    return dict(MILVUS_HNSW) if kind == "HNSW" else {}


def default_search_params(index_type: str, index_params: dict[str, Any], size: int) -> dict[str, Any]:
    """Search parameters when FACEGATE_MILVUS_SEARCH_PARAMS is empty: facegate's FAISS defaults for
    the same kind and size (AUTOINDEX and the others: Milvus's own)."""
    kind = index_type.upper()
    if kind.startswith("IVF"):
        nlist = int(index_params.get("nlist", 128))  # 128: Milvus's default for a collection made elsewhere
        return {"nprobe": default_nprobe(nlist)}
    return {"ef": default_ef_search(size)} if kind == "HNSW" else {}


def redacted(uri: str) -> str:
    """The URI without credentials, for /readyz and logs."""
    parts = urlsplit(uri)
    if not parts.scheme or parts.scheme == "file" or not parts.netloc:
        return uri
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"


class MilvusIndex:
    """The VectorIndex of a Milvus collection `facegate_<embedder sha256[:16]>` (id INT64 primary key,
    embedding FLOAT_VECTOR, inner product). Every Milvus failure is a 503 (`GalleryUnavailable`);
    the next call reconnects."""

    shared = True

    def __init__(
        self,
        uri: str,
        token: str,
        dim: int,
        model_sha256: str,
        index_type: str = "AUTOINDEX",
        consistency: str = "Strong",
        timeout: float = 5.0,
        index_params: dict[str, Any] | None = None,
        search_params: dict[str, Any] | None = None,
        partition: str = DEFAULT,
    ):
        """`index_type` and `index_params` build a new collection (an existing one keeps its own);
        `search_params` empty: facegate's default for the collection's index, set by `tune`.
        `partition`: the facegate collection this handle writes and searches (its partition key's value)."""
        self.uri, self.token, self.dim = uri, token, dim
        self.partition = partition
        self.partitioned = True  # the Milvus collection has the partition key (one made before collections has not)
        self.collection = f"facegate_{model_sha256[:16]}"
        self.index_type, self.consistency, self.timeout = index_type, consistency, timeout
        self.index_params = dict(index_params or default_index_params(index_type, dim))
        self.requested_params = dict(search_params or {})  # FACEGATE_MILVUS_SEARCH_PARAMS
        self.search_params = dict(self.requested_params)  # in force
        self.widened_from: dict[str, Any] | None = None  # the parameters before the recall check widened them
        self.changes = 0
        self._client = None
        self._lock = threading.Lock()
        self._call(lambda client: None)  # connect and create the collection now: a wrong URI fails start-up

    def _connect(self):
        from pymilvus import DataType, MilvusClient  # pymilvus is needed only with FACEGATE_MILVUS_URI

        client = MilvusClient(uri=self.uri, token=self.token, timeout=self.timeout)
        if not client.has_collection(self.collection, timeout=self.timeout):
            schema = MilvusClient.create_schema(auto_id=False)
            schema.add_field("id", DataType.INT64, is_primary=True)
            schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=self.dim)
            schema.add_field(PARTITION_FIELD, DataType.VARCHAR, max_length=64, is_partition_key=True)
            params = client.prepare_index_params()
            params.add_index("embedding", index_type=self.index_type, metric_type="IP", params=self.index_params)
            client.create_collection(
                self.collection, schema=schema, index_params=params, consistency_level=self.consistency, timeout=self.timeout
            )
            log.info(
                "milvus %s: collection %s created (%s, IP, %s consistency)",
                redacted(self.uri),
                self.collection,
                self.index_type,
                self.consistency,
            )
        fields = client.describe_collection(self.collection, timeout=self.timeout).get("fields", [])
        self.partitioned = any(f.get("name") == PARTITION_FIELD for f in fields)
        if not self.partitioned and self.partition != DEFAULT:
            client.close()
            raise GalleryUnavailable(
                f"the Milvus collection {self.collection} was made before facegate had collections: it serves `default` only; "
                f"drop it and run `facegate gallery sync-index` to serve collection {self.partition!r}"
            )
        client.load_collection(self.collection, timeout=self.timeout)
        self._read_index(client)
        return client

    @property
    def _filter(self) -> str:
        """This facegate collection's rows (a name of [A-Za-z0-9_.-] only: nothing to escape)."""
        return f'{PARTITION_FIELD} == "{self.partition}"' if self.partitioned else ""

    def _read_index(self, client) -> None:
        """The index the collection has (it may predate these settings): its type and build parameters.
        Best effort: unanswered (Milvus Lite can take long after a bulk load), the configured ones stand."""
        import grpc
        from pymilvus import MilvusException

        try:
            info: dict[str, Any] = client.describe_index(self.collection, "embedding", timeout=self.timeout) or {}
        except (MilvusException, grpc.RpcError) as exc:
            log.warning(
                "milvus %s: the index of %s was not described (%s): assuming %s", redacted(self.uri), self.collection, exc, self.index_type
            )
            return
        self.index_type = str(info.get("index_type", self.index_type))
        built: dict[str, Any] = info["params"] if isinstance(info.get("params"), dict) else info
        for name in ("nlist", "M", "efConstruction", "m", "nbits"):
            if name in built:
                self.index_params[name] = int(built[name])

    def _call(self, fn):
        import grpc  # pymilvus's transport: a deadline or a dropped stream surfaces as its RpcError
        from pymilvus import MilvusException

        try:
            with self._lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
            return fn(client)
        except (MilvusException, grpc.RpcError) as exc:
            with self._lock:
                self._client = None  # reconnect on the next call
            reason = exc.message if isinstance(exc, MilvusException) else f"{exc.code().name}: {exc.details()}"
            raise GalleryUnavailable(f"the vector database (Milvus at {redacted(self.uri)}) is unavailable: {reason}") from exc

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert: adding an id again (re-embedding) replaces its vector."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        vectors = np.asarray(vectors, np.float32).reshape(-1, self.dim)
        for start in range(0, len(ids), UPSERT_BATCH):
            tag = {PARTITION_FIELD: self.partition} if self.partitioned else {}
            rows = [
                {"id": int(i), "embedding": v.tolist(), **tag}
                for i, v in zip(ids[start : start + UPSERT_BATCH], vectors[start : start + UPSERT_BATCH], strict=True)
            ]
            self._call(lambda client: client.upsert(self.collection, rows, timeout=self.timeout))
        self.changes += len(ids)

    def remove(self, ids: np.ndarray) -> int:
        face_ids = [int(i) for i in np.asarray(ids, np.int64).reshape(-1)]
        if not face_ids:
            return 0
        result = self._call(lambda client: client.delete(self.collection, ids=face_ids, timeout=self.timeout))
        self.changes += len(face_ids)
        return int(result.get("delete_count", len(face_ids))) if isinstance(result, dict) else len(face_ids)

    def search(self, queries: np.ndarray, k: int, approximate: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Milvus's answer (no exact copy is kept here: `approximate` changes nothing)."""
        queries = np.asarray(queries, np.float32).reshape(-1, self.dim)
        if k <= 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        hits = self._call(
            lambda client: client.search(
                self.collection,
                data=queries.tolist(),
                filter=self._filter,
                limit=k,
                search_params={"metric_type": "IP", "params": self._search_params(k)},
                consistency_level=self.consistency,
                timeout=self.timeout,
            )
        )
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        for row, found in enumerate(hits):
            for col, hit in enumerate(found[:k]):
                scores[row, col], ids[row, col] = hit["distance"], hit["id"]
        return scores, ids

    @property
    def size(self) -> int:
        """Rows in the collection now (count(*) at the configured consistency, deletes applied)."""
        rows = self._call(
            lambda client: client.query(
                self.collection, filter=self._filter, output_fields=["count(*)"], consistency_level=self.consistency, timeout=self.timeout
            )
        )
        return int(rows[0]["count(*)"])

    def _search_params(self, k: int) -> dict[str, Any]:
        """HNSW's ef must be at least the faces asked for (a search asks for more when too few subjects came back)."""
        return {**self.search_params, "ef": max(int(self.search_params["ef"]), k)} if "ef" in self.search_params else self.search_params

    @property
    def exact(self) -> bool:
        return self.index_type.upper() in ("FLAT", "BIN_FLAT")

    def tune(self) -> dict[str, Any] | None:
        """Without FACEGATE_MILVUS_SEARCH_PARAMS, set the default search parameters for the
        collection's index and size now; the parameters when they changed, else None."""
        if self.requested_params or self.widened_from:  # given, or widened for a measured recall: kept
            return None
        size = self.size if self.index_type.upper() == "HNSW" else 0  # only ef depends on it: no count otherwise
        params = default_search_params(self.index_type, self.index_params, size)
        if params == self.search_params:
            return None
        self.search_params = params
        return params

    def flush(self) -> None:
        """Seal what was upserted into segments Milvus indexes. Rows left in a growing segment are
        searched row by row: on Milvus Lite 20,000 of them cost 1.5 s a search (and a count), 85 ms
        once flushed (docs/benchmarks.md), so a bulk fill ends with this."""
        self._call(lambda client: client.flush(self.collection, timeout=self.timeout))

    def widen(self) -> dict[str, Any] | None:
        """Twice the `ef` (up to MAX_EF_SEARCH) or `nprobe` (up to nlist) in force; None for an index
        searched with Milvus's own parameters, or already at the widest."""
        params = dict(self.search_params)
        if "ef" in params and int(params["ef"]) < MAX_EF_SEARCH:
            params["ef"] = min(2 * int(params["ef"]), MAX_EF_SEARCH)
        elif "nprobe" in params and int(params["nprobe"]) < int(self.index_params.get("nlist", params["nprobe"])):
            params["nprobe"] = min(2 * int(params["nprobe"]), int(self.index_params["nlist"]))
        else:
            return None
        self.widened_from = self.widened_from or dict(self.search_params)
        self.search_params = params
        return params

    @property
    def answers_exactly(self) -> bool:
        """IVF_FLAT searched at every list: each distance is computed from the stored vector, so the
        answer is FLAT's. Milvus has no exact search beside its other indexes (HNSW, IVF_SQ8, IVF_PQ,
        DISKANN…: no parameter bypasses them), and a copy in this process would miss the writes
        other replicas send Milvus directly: there a recall under the minimum stays a /readyz problem."""
        nlist = self.index_params.get("nlist")
        return self.index_type.upper() == "IVF_FLAT" and nlist is not None and int(self.search_params.get("nprobe", 0)) >= int(nlist)

    def sample_ids(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Up to n ids drawn uniformly (a reservoir over every id: Milvus has no random sample)."""
        reservoir: list[int] = []
        seen = 0
        for batch in self.ids():
            for face_id in batch:
                seen += 1
                if len(reservoir) < n:
                    reservoir.append(face_id)
                elif (slot := int(rng.integers(seen))) < n:
                    reservoir[slot] = face_id
        return np.array(sorted(reservoir), np.int64)

    def ids(self, batch: int = 10_000) -> Iterator[list[int]]:
        """Every id in the collection, a batch at a time."""
        iterator = self._call(
            lambda client: client.query_iterator(
                self.collection, batch_size=batch, filter=self._filter, output_fields=["id"], timeout=self.timeout
            )
        )
        try:
            while rows := self._call(lambda client: iterator.next()):
                yield [r["id"] for r in rows]
        finally:
            iterator.close()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "milvus",
            "uri": redacted(self.uri),
            "collection": self.collection,
            "partition": self.partition if self.partitioned else None,
            "index_type": self.index_type,
            "index_params": self.index_params,
            "search_params": self.search_params,
            "search_params_source": "widened"
            if self.widened_from
            else "FACEGATE_MILVUS_SEARCH_PARAMS"
            if self.requested_params
            else "default",
            **({"widened_from": self.widened_from} if self.widened_from else {}),
            **({} if self.requested_params or self.exact or not self.search_params else {"target_recall": TARGET_RECALL}),
            "metric": "IP",
            "consistency": self.consistency,
            "size": self.size,
        }

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def open_milvus(config: IndexConfig, dim: int, model_sha256: str, partition: str = DEFAULT) -> MilvusIndex:
    index = MilvusIndex(
        config.milvus_uri,
        config.milvus_token,
        dim,
        model_sha256,
        config.milvus_index,
        config.milvus_consistency,
        config.milvus_timeout,
        config.milvus_index_params,
        config.milvus_search_params,
        partition,
    )
    index.tune()
    log.info(
        "gallery index: Milvus at %s, collection %s (%s %s, search parameters %s%s, %s consistency)",
        redacted(config.milvus_uri),
        index.collection,
        index.index_type,
        index.index_params,
        index.search_params or "Milvus's own",
        " from FACEGATE_MILVUS_SEARCH_PARAMS" if index.requested_params else ", facegate's default",
        config.milvus_consistency,
    )
    return index


def fill(
    store: GalleryStore,
    index: MilvusIndex,
    after_id: int = 0,
    batch: int = UPSERT_BATCH,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Bring Milvus in line with the store (`facegate gallery sync-index`): upsert every face of the
    active embedder with id > after_id, in id order, then remove ids the store no longer has
    (deletes Milvus missed while unreachable). Upserts make it safe to rerun; an interrupted run
    goes on from the last id `progress` reported. Returns (upserted, removed)."""
    upserted = 0
    while True:
        ids, vectors = store.embeddings_after(after_id, batch)
        if len(ids) == 0:
            break
        index.add(ids, vectors)
        upserted, after_id = upserted + len(ids), int(ids[-1])
        if progress:
            progress(upserted, after_id)
    removed = 0
    for stored in index.ids():
        gone = sorted(set(stored) - set(store.lookup_faces(stored)))
        removed += index.remove(np.array(gone, np.int64)) if gone else 0
    index.flush()
    return upserted, removed
