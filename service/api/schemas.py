"""Request options and response models: the OpenAPI schema at /docs is generated from these."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.detect import Face
from service.gallery import Candidate, FaceRecord, Subject

SUBJECT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$"

FarField = Field(None, description="False-accept rate whose manifest threshold decides (e.g. 1e-3 or \"1e-3\"); default FACEGATE_DEFAULT_FAR.", examples=["1e-3"])
ThresholdField = Field(None, ge=-1.0, le=1.0, description="Explicit cosine threshold instead of a FAR (the response's far is then null).")
AlignedField = Field(False, description="The images are already aligned 112×112 crops: detection is skipped.")
PolicyField = Field("largest", description="`largest`: use the largest face; `reject_multiple`: 422 multiple_faces when an image has more than one.")


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VerifyOptions(_Options):
    subject_id: str | None = Field(None, description="Compare image1 with this subject's enrolled faces (instead of image2).")
    far: float | str | None = FarField
    threshold: float | None = ThresholdField
    face_policy: Literal["largest", "reject_multiple"] = PolicyField
    aligned: bool = AlignedField


class IdentifyOptions(_Options):
    top_k: int = Field(5, ge=1, le=100, description="Candidates to return, one per subject.")
    far: float | str | None = FarField
    threshold: float | None = ThresholdField
    faces: Literal["largest", "all"] = Field("largest", description="`all` identifies every face of the image (see `results`).")
    face_policy: Literal["largest", "reject_multiple"] = PolicyField
    aligned: bool = AlignedField


class EmbedOptions(_Options):
    aligned: bool = AlignedField


class EnrollOptions(_Options):
    face_policy: Literal["largest", "reject_multiple"] = PolicyField
    aligned: bool = AlignedField


class ErrorBody(BaseModel):
    code: str = Field(examples=["no_face"])
    message: str = Field(examples=["no face was found in the image"])
    details: list[dict[str, Any]] | None = Field(None, description="Per-item errors (bulk enrollment).")


class ErrorResponse(BaseModel):
    error: ErrorBody


class FaceOut(BaseModel):
    box: list[float] = Field(description="x1, y1, x2, y2 in image pixels.", examples=[[61.2, 72.9, 183.4, 221.0]])
    landmarks: list[list[float]] = Field(description="5 (x, y) points: right eye, left eye, nose, right and left mouth corner.")
    score: float = Field(description="Detection score.", examples=[0.93])

    @classmethod
    def of(cls, face: Face | None) -> FaceOut | None:
        if face is None:
            return None
        return cls(
            box=[round(float(v), 2) for v in face.box],
            landmarks=[[round(float(x), 2), round(float(y), 2)] for x, y in face.landmarks],
            score=round(face.score, 4),
        )


class ModelOut(BaseModel):
    name: str = Field(examples=["facegate-default"])
    version: str = Field(examples=["1.0"])
    sha256: str


class VerifyResponse(BaseModel):
    match: bool
    similarity: float = Field(description="Cosine similarity; against a subject, the max over its enrolled faces.", examples=[0.71])
    threshold: float = Field(examples=[0.42])
    far: str | None = Field(description="The FAR the threshold stands for; null for an explicit threshold.", examples=["1e-3"])
    faces: list[FaceOut | None] = Field(description="The face used from each image (null for an aligned upload); one entry when verifying against a subject.")
    subject_id: str | None = None
    model: ModelOut


class CandidateOut(BaseModel):
    subject_id: str
    name: str
    similarity: float

    @classmethod
    def of(cls, c: Candidate) -> CandidateOut:
        return cls(subject_id=c.subject_id, name=c.name, similarity=round(c.similarity, 6))


class IdentifyResult(BaseModel):
    face: FaceOut | None
    candidates: list[CandidateOut] = Field(description="Best subjects first, each once (its best face's similarity).")
    match: CandidateOut | None = Field(description="The best candidate if it reaches the threshold, else null: the person is unknown.")


class IdentifyResponse(IdentifyResult):
    threshold: float
    far: str | None
    model: ModelOut
    results: list[IdentifyResult] | None = Field(None, description="With faces=all: one result per face, largest first (the top-level fields repeat the first).")


class EmbeddedFaceOut(BaseModel):
    face: FaceOut | None
    embedding: list[float] = Field(description="L2-normalized embedding.")


class EmbedResponse(BaseModel):
    faces: list[EmbeddedFaceOut] = Field(description="Every face, largest first.")
    dim: int
    model: ModelOut


class SubjectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(None, pattern=SUBJECT_ID_PATTERN, description="Client-chosen id; a random one when omitted.", examples=["emp-1042"])
    name: str = Field(min_length=1, max_length=256, examples=["Ada Lovelace"])
    metadata: dict[str, Any] = Field(default_factory=dict, examples=[{"department": "R&D"}])


class SubjectPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, min_length=1, max_length=256)
    metadata: dict[str, Any] | None = Field(None, description="Replaces the stored metadata.")


def _time(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


class SubjectOut(BaseModel):
    id: str
    name: str
    metadata: dict[str, Any]
    face_count: int
    created: datetime
    updated: datetime

    @classmethod
    def of(cls, s: Subject) -> SubjectOut:
        return cls(id=s.id, name=s.name, metadata=s.metadata, face_count=s.face_count, created=_time(s.created), updated=_time(s.updated))


class SubjectPage(BaseModel):
    subjects: list[SubjectOut]
    total: int
    limit: int
    offset: int


class StoredFaceOut(BaseModel):
    face_id: int
    subject_id: str
    box: list[float] | None = Field(description="Null for an aligned upload.")
    landmarks: list[list[float]] | None
    score: float | None
    model: str = Field(description="The embedder that made the stored embedding.")
    model_sha256: str
    searchable: bool = Field(description="Made by the active embedder (else never compared until re-embedded).")
    created: datetime

    @classmethod
    def of(cls, r: FaceRecord, active_sha256: str | None) -> StoredFaceOut:
        return cls(
            face_id=r.id,
            subject_id=r.subject_id,
            box=r.box,
            landmarks=r.landmarks,
            score=r.score,
            model=r.model_name,
            model_sha256=r.model_sha256,
            searchable=r.model_sha256 == active_sha256,
            created=_time(r.created),
        )


class EnrollItem(BaseModel):
    index: int = Field(description="Position of the image in `images`.")
    face: StoredFaceOut | None = None
    error: ErrorBody | None = None


class EnrollBulkResponse(BaseModel):
    enrolled: int
    results: list[EnrollItem]


class FacePage(BaseModel):
    faces: list[StoredFaceOut]
