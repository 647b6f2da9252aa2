"""What a gallery store offers the API and the CLI: the records it returns and the methods it
implements: `SqliteGallery` (sqlite.py, one process) and `PostgresGallery` (postgres.py, replicas
sharing one database); `open_gallery` (factory.py) picks one from the settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from service.core.alignment import FaceChip
from service.core.decision import Candidate
from service.core.open_set import GalleryShape, LeaveOneOut


@dataclass(frozen=True)
class Subject:
    id: str
    name: str
    metadata: dict[str, Any]
    created: float
    updated: float
    face_count: int
    unique_name: bool = False  # holds its name's key (names.py): the name alone finds it


@dataclass(frozen=True)
class NewFace:
    embedding: np.ndarray
    box: list[float] | None = None
    landmarks: list[list[float]] | None = None
    score: float | None = None
    chip: FaceChip | None = None  # kept only with FACEGATE_STORE_CROPS: what re-embedding re-aligns


@dataclass(frozen=True)
class FaceRecord:
    id: int
    subject_id: str
    box: list[float] | None
    landmarks: list[list[float]] | None
    score: float | None
    model_name: str
    model_sha256: str
    created: float


class GalleryStore(Protocol):
    """Every write is durable before it returns; faces made by another embedder than the active one
    are stored but never compared (`incompatible` counts them by model)."""

    incompatible: dict[str, int]

    def close(self) -> None: ...

    @property
    def loading(self) -> bool:
        """The index and open-set guard are still being built at start-up (/readyz 503, searches 503 gallery_loading)."""
        return False

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Until they are built (True), or the store is closed first or `timeout` passes (False)."""
        return True

    def create_subject(self, name: str, metadata: dict[str, Any], subject_id: str | None = None, unique_name: bool = False) -> Subject:
        """SubjectExists where the id is taken, or with `unique_name` where another subject holds the name's key."""
        ...

    def get_subject(self, subject_id: str) -> Subject: ...

    def subject_by_name(self, name: str) -> Subject:
        """The subject holding `name`'s key (names.py), whatever the case it was given in; SubjectNotFound if none."""
        ...

    def unique_names(self, subject_ids: list[str]) -> dict[str, str]:
        """The names of those of `subject_ids` that hold their name's key (others are left out)."""
        ...

    def list_subjects(self, limit: int, offset: int, search: str | None = None) -> tuple[list[Subject], int]:
        """A page of subjects in creation order, and how many there are; with `search`, only those
        whose name or id holds it, compared by their name keys (`service.gallery.names`: NFC, lower case)."""
        ...

    def update_subject(self, subject_id: str, name: str | None, metadata: dict[str, Any] | None) -> Subject:
        """A subject holding its name's key takes the new name's with it (SubjectExists if another holds that)."""
        ...

    def delete_subject(self, subject_id: str) -> int: ...

    def merge_subjects(self, source_id: str, target_id: str) -> int:
        """Every face of `source_id` moved to `target_id`, `source_id` deleted, in one transaction; how many faces moved."""
        ...

    def add_faces(self, subject_id: str, faces: list[NewFace]) -> list[FaceRecord]: ...

    def list_faces(self, subject_id: str) -> list[FaceRecord]: ...

    def delete_face(self, face_id: int) -> str:
        """Delete a face, whichever model made it (FaceNotFound if none has the id); its subject's id."""
        ...

    def delete_faces(self, face_ids: list[int]) -> dict[int, str]:
        """Delete those of `face_ids` the store holds, whichever model made them, in one statement
        (the caller bounds the list); {face id: its subject's id} of those deleted."""

    def face_chip(self, face_id: int) -> bytes | None:
        """The PNG of a face's stored chip; None for a face enrolled without FACEGATE_STORE_CROPS
        (FaceNotFound if none has the id)."""
        ...

    def subject_embeddings(self, subject_id: str) -> np.ndarray: ...

    def search(self, query: np.ndarray, top_k: int) -> list[Candidate]: ...

    def lookup_faces(self, face_ids: list[int]) -> dict[int, tuple[str, str, np.ndarray]]:
        """(subject id, name, embedding) of those of `face_ids` the store holds for the active embedder."""
        ...

    def face_chips(self, face_ids: list[int]) -> dict[int, FaceChip]:
        """The stored chips of those of `face_ids` that have one (kept with FACEGATE_STORE_CROPS)."""
        ...

    def embeddings_after(self, after_id: int, limit: int) -> tuple[np.ndarray, np.ndarray]: ...

    def mated_faces(self) -> tuple[np.ndarray, np.ndarray]:
        """Ids of the active embedder's faces whose subject has another, and their subjects: the
        index's recall check searches a sample of them with each left out, as another photo of an
        enrolled person."""
        ...

    def counts(self, searchable: int | None = None) -> dict[str, int]:
        """subjects, faces, searchable_faces (the index's size; `searchable` when the caller has just
        read it: Milvus counts with a query) and incompatible_faces (another embedder's)."""
        ...

    def collection_counts(self) -> dict[str, dict[str, int]]:
        """Subjects and faces of every collection of the database (not only this handle's), by name."""
        ...

    def index_info(self) -> dict[str, Any] | None:
        """The vector index searches run on (backend, parameters, size); None where nothing is searched."""
        ...

    def shape(self) -> GalleryShape:
        """The subjects and faces searches run on, and the open-set guard's leave-one-out tail
        (service/core/open_set.py): what an FPIR decision is made for."""
        ...

    def leave_one_out(self) -> LeaveOneOut | None:
        """The open-set guard's leave-one-out state `shape` reads its tail from, as of the last
        change; None where none is kept (FACEGATE_OPEN_SET_GUARD=false, Milvus on PostgreSQL, a
        store opened for maintenance)."""
        ...

    def replication(self) -> dict[str, int | bool] | None:
        """Where this replica's index stands in the shared change sequence (applied_sequence,
        database_sequence, lag, listening); None for a single-process store."""
        ...

    def reembed(self, embed: Callable[[np.ndarray], np.ndarray], template: str, batch: int = 64) -> tuple[int, int]:
        """Re-embed faces another model made from their stored chips, each re-aligned onto `template`
        (the active embedder's `alignment`), committed batch by batch: (re-embedded, without a chip)."""
        ...
