"""Request options and response models: the OpenAPI schema at /docs is generated from these."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, overload

from pydantic import BaseModel, Field

from service.api import metadata
from service.core.decision import Margin
from service.core.models.detector import Face
from service.core.models.manifest import Manifest, Template
from service.core.settings import Settings
from service.core.strict import StrictModel
from service.gallery.interface import Candidate, FaceRecord, Subject

INT64_MAX = 2**63 - 1  # SQLite's and FAISS's id range: larger numbers are bad input, not a crash
SUBJECT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$"
# A name holds no NUL: PostgreSQL refuses it in text where SQLite stored it (ids: SubjectIdPath).
NAME_PATTERN = r"^[^\x00]+$"
SURROGATE = re.compile("[\ud800-\udfff]")  # in a str only unpaired (a pair decodes to one character)

FarField = Field(
    None,
    description='False-accept rate whose manifest threshold decides (e.g. 1e-3 or "1e-3"); default FACEGATE_DEFAULT_FAR.',
    examples=["1e-3"],
)
ThresholdField = Field(None, ge=-1.0, le=1.0, description="Explicit cosine threshold instead of a FAR (the response's far is then null).")
AlignedField = Field(
    False,
    description=(
        "The images are already aligned crops of the active embedder's template size "
        "(150×150 for dlib_150, 112×112 for arcface_112): detection is skipped."
    ),
)
FacePolicy = Annotated[
    Literal["largest", "reject_multiple"],
    Field(description="`largest`: use the largest face; `reject_multiple`: 422 multiple_faces when an image has more than one."),
]


class VerifyOptions(StrictModel):
    subject_id: str | None = Field(
        None, pattern=SUBJECT_ID_PATTERN, description="Compare image1 with this subject's enrolled faces (instead of image2)."
    )
    far: float | str | None = FarField
    threshold: float | None = ThresholdField
    face_policy: FacePolicy = "largest"
    aligned: bool = AlignedField


class IdentifyOptions(StrictModel):
    top_k: int = Field(5, ge=1, le=100, description="Candidates to return, one per subject.")
    fpir: float | None = Field(
        None,
        ge=1e-9,
        lt=1,
        description="False-positive identification rate: the chance that a person who is not enrolled is returned "
        "as a match, whatever the gallery's size (default FACEGATE_DEFAULT_FPIR, 1e-2). Give at most one of fpir, far, threshold.",
        examples=[1e-3],
    )
    far: float | str | None = Field(
        None,
        description="Per-comparison false-accept rate instead of an FPIR (each enrolled face is one comparison, "
        "so strangers pass about gallery-size times as often).",
        examples=["1e-3"],
    )
    threshold: float | None = ThresholdField
    faces: Literal["largest", "all"] = Field("largest", description="`all` identifies every face of the image (see `results`).")
    face_policy: FacePolicy = "largest"
    aligned: bool = AlignedField


class EmbedOptions(StrictModel):
    aligned: bool = AlignedField


class EnrollOptions(StrictModel):
    face_policy: FacePolicy = "largest"
    aligned: bool = AlignedField
    allow_low_quality: bool = Field(
        False,
        description="Enroll a face the quality gate would refuse (too small, blurred, turned aside, tilted, dark, or a low "
        "detection score); the answer's `quality_warning` then says what failed.",
    )


class ErrorBody(BaseModel):
    code: str = Field(examples=["no_face"])
    message: str = Field(examples=["no face was found in the image"])
    details: list[dict[str, Any]] | None = Field(None, description="Per-item errors (bulk enrollment).")


class ErrorResponse(BaseModel):
    error: ErrorBody


ERROR_STATUSES = {
    400: "Undecodable image or JSON",
    401: "Missing or invalid X-API-Key (when keys are configured)",
    404: "Unknown subject or face",
    409: "A subject with this id (or, for a subject of the compatible APIs, this name) exists",
    413: "Body or image too large",
    415: "Unsupported content type or image format",
    422: "Bad parameters, no face, multiple faces, low quality, unknown FAR",
    503: (
        "Not ready (a model missing, warming up or failing; the gallery index loading, with Retry-After), "
        "overloaded (retry after Retry-After), or the gallery unreachable"
    ),
}


def error_responses(*statuses: int) -> dict:
    """`responses=` entries for a route's error statuses, all in the one error schema."""
    return {s: {"model": ErrorResponse, "description": ERROR_STATUSES[s]} for s in statuses}


class FaceOut(BaseModel):
    box: list[float] = Field(description="x1, y1, x2, y2 in image pixels.", examples=[[61.2, 72.9, 183.4, 221.0]])
    landmarks: list[list[float]] = Field(description="5 (x, y) points: right eye, left eye, nose, right and left mouth corner.")
    score: float = Field(description="Detection score.", examples=[0.93])

    @overload
    @classmethod
    def of(cls, face: Face) -> FaceOut: ...
    @overload
    @classmethod
    def of(cls, face: Face | None) -> FaceOut | None: ...
    @classmethod
    def of(cls, face: Face | None) -> FaceOut | None:
        """None for no face (an aligned crop skips detection)."""
        return cls(**face.as_json()) if face is not None else None


class ModelOut(BaseModel):
    name: str = Field(examples=["facegate-default"])
    version: str = Field(examples=["1.0"])
    sha256: str

    @classmethod
    def of(cls, manifest: Manifest) -> ModelOut:
        return cls(name=manifest.name, version=manifest.version, sha256=manifest.file.sha256)


class ModelsResponse(BaseModel):
    detector: dict[str, Any] | None = Field(description="The served detector's manifest; null when none is loaded (/readyz says why).")
    embedder: dict[str, Any] | None = Field(
        description="The served embedder's manifest (license, thresholds per FAR, the calibrated far_curve, accuracy in `metrics`)."
    )
    default_far: str = Field(description="FACEGATE_DEFAULT_FAR: the FAR /verify decides at when a request names none.")
    default_fpir: float = Field(description="FACEGATE_DEFAULT_FPIR: the FPIR /identify decides at when a request names none.")


class VerifyResponse(BaseModel):
    match: bool
    similarity: float = Field(
        description="Cosine similarity; against a subject, with the mean of its enrolled faces (`template` mean) or the max over them.",
        examples=[0.71],
    )
    threshold: float = Field(description="The cosine `similarity` must reach to match.", examples=[0.42])
    far: str | None = Field(description="The FAR the threshold stands for; null for an explicit threshold.", examples=["1e-3"])
    subject_faces: int | None = Field(
        None,
        description="Against a subject: its enrolled faces. With more than one, the mean of them is held to the model's cosine rows "
        "for one subject of k faces at `far` (`template` mean), or, without rows for the mean, each face is held to the per-comparison "
        "FAR that keeps the subject at `far` (1 − (1 − far)^(1/k)): either way `threshold` is above the model's threshold for `far`.",
    )
    template: Template | None = Field(
        None,
        description="Against a subject: what `similarity` is against, its faces' mean (`mean`) or its best face (`best_face`); "
        "null for two images.",
    )
    faces: list[FaceOut | None] = Field(
        description="The face used from each image (null for an aligned upload); one entry when verifying against a subject."
    )
    subject_id: str | None = None
    model: ModelOut
    warning: str | None = Field(
        None,
        description=(
            "Set when the decision is not at the FAR asked for: the model has no threshold for FACEGATE_DEFAULT_FAR, "
            "so a request naming no far was decided at the nearest calibrated FAR (`far` says which)."
        ),
    )


class CandidateOut(BaseModel):
    subject_id: str
    name: str
    similarity: float = Field(description="The raw cosine with the subject's template, `template` (-1 … 1).")
    template: Template = Field(
        "best_face",
        description="What `similarity` is against: the subject's best face, or the mean of its faces (normalized), which a "
        "small gallery is decided on when the model's cosine rows are calibrated for it; there `best_face` names a subject "
        "whose best face says more than its mean (its `score` that face's on the mean's scale).",
    )
    score: float | None = Field(
        None,
        description="The number an FPIR decision holds this candidate to, on `threshold`'s scale (of the kind `score` names): "
        "its cosine (on the mean's rows, a best face's as the mean's cosine of the same stranger rate), or its margin or "
        "AS-norm score; the match is the best candidate when its score reaches `threshold`.",
    )

    @classmethod
    def of(cls, c: Candidate, score: float | None = None) -> CandidateOut:
        return cls(
            subject_id=c.subject_id,
            name=c.name,
            similarity=round(c.similarity, 6),
            template=c.template,
            score=None if score is None else round(score, 6),
        )


class IdentifyResult(BaseModel):
    face: FaceOut | None
    candidates: list[CandidateOut] = Field(description="Best subjects first, each once (ranked by the similarity with their `template`).")
    match: CandidateOut | None = Field(description="The best candidate if it reaches the threshold, else null: the person is unknown.")
    best_score: float | None = Field(
        None,
        description="The best candidate's score, which `threshold` applies to (of the kind `score` names); null without candidates.",
    )


class OpenSetOut(BaseModel):
    """How a margin decision's threshold came about (docs/api.md, "Identify decisions")."""

    subjects: int = Field(description="Enrolled subjects searched (N).")
    faces_per_subject: float = Field(description="Searchable faces per subject, on average: the table is read for it.")
    table_threshold: float = Field(description="T_sim(N, fpir): the model's calibrated table, read for this gallery.")
    guard_threshold: float | None = Field(
        description="T_LOSO(2 · fpir) from the gallery's own faces, each scored against the other subjects (from 100 subjects; else null)."
    )

    @classmethod
    def of(cls, margin: Margin | None) -> OpenSetOut | None:
        if margin is None:
            return None
        guard = margin.detail.guard
        return cls(
            subjects=margin.gallery.subjects,
            faces_per_subject=round(margin.gallery.faces_per_subject, 3),
            table_threshold=round(margin.detail.table, 6),
            guard_threshold=None if guard is None else round(guard, 6),
        )


class IdentifyResponse(IdentifyResult):
    threshold: float = Field(description="The score the best candidate must reach to be the match.")
    score: Literal["cosine", "as-norm", "margin"] = Field(
        "cosine",
        description=(
            "What `threshold` applies to: for an FPIR decision the margin score (the best candidate's cosine and how far it stands "
            "above the next subjects') when the model has its open-set table, with a cohort (FACEGATE_COHORT) the AS-norm score, "
            "else the cosine; for an explicit far or threshold the cosine."
        ),
    )
    far: str | None = Field(
        description=(
            "The per-comparison FAR the threshold stands for (from the FPIR and the gallery's size); "
            "null for an explicit threshold and for a margin decision."
        )
    )
    fpir: float | None = Field(description="The false-positive identification rate promised; null when far or threshold was given.")
    gallery_faces: int | None = Field(description="The number of searchable faces the FPIR was turned into a threshold for.")
    extrapolated: bool = Field(
        False,
        description="True when the threshold comes from beyond the calibrated points: the cosine curve's fitted tail, "
        "or the open-set table read beyond its gallery sizes, FPIRs or faces per subject.",
    )
    open_set: OpenSetOut | None = Field(None, description="For a margin decision: the gallery it was made for and its table and guard.")
    model: ModelOut
    results: list[IdentifyResult] | None = Field(
        None, description="With faces=all: one result per face, largest first (the top-level fields repeat the first)."
    )


class EmbeddedFaceOut(BaseModel):
    face: FaceOut | None
    embedding: list[float] = Field(description="L2-normalized embedding.")


class EmbedResponse(BaseModel):
    faces: list[EmbeddedFaceOut] = Field(description="Every face, largest first.")
    dim: int
    model: ModelOut


class SubjectIn(StrictModel):
    id: str | None = Field(
        None, pattern=SUBJECT_ID_PATTERN, description="Client-chosen id; a random one when omitted.", examples=["emp-1042"]
    )
    name: str = Field(min_length=1, max_length=256, pattern=NAME_PATTERN, examples=["Ada Lovelace"])
    metadata: dict[str, Any] = Field(default_factory=dict, examples=[{"department": "R&D"}])


class SubjectPatch(StrictModel):
    name: str | None = Field(None, min_length=1, max_length=256, pattern=NAME_PATTERN)
    metadata: dict[str, Any] | None = Field(None, description="Replaces the stored metadata.")


class SubjectMerge(StrictModel):
    subject_id: str = Field(
        pattern=SUBJECT_ID_PATTERN, description="The subject merged in: its faces move, then it is deleted.", examples=["emp-1042-old"]
    )


def _time(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


def _servable(text: str) -> str:
    """`text` with any unpaired surrogate (a name stored before they were refused) as U+FFFD: no
    JSON answer can carry one, and one row must not fail a whole page."""
    return SURROGATE.sub("\ufffd", text)


class SubjectOut(BaseModel):
    id: str
    name: str
    metadata: dict[str, Any]
    metadata_withheld: str | None = Field(
        None,
        description=(
            "Why the stored metadata is not served (over the metadata limits: stored before them); "
            "`metadata` is then {} until a PATCH replaces it."
        ),
    )
    face_count: int
    created: datetime
    updated: datetime

    @classmethod
    def of(cls, s: Subject, settings: Settings) -> SubjectOut:
        withheld = metadata.problem(s.metadata, settings)
        if withheld:
            withheld += "; PATCH the subject's metadata to replace it"
        return cls(
            id=s.id,
            name=_servable(s.name),
            metadata={} if withheld else s.metadata,
            metadata_withheld=withheld,
            face_count=s.face_count,
            created=_time(s.created),
            updated=_time(s.updated),
        )


class SubjectPage(BaseModel):
    subjects: list[SubjectOut]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(
        description=(
            "Where the next page starts, null after the last. A page can hold fewer than `limit` subjects (FACEGATE_MAX_PAGE_BYTES)."
        )
    )


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


class DuplicateOut(BaseModel):
    """Another subject the new face would be identified as."""

    subject_id: str
    name: str
    similarity: float = Field(description="The face's cosine with that subject's template, `template`.")
    template: Template = Field("best_face", description="What `similarity` is against: the subject's best face, or its faces' mean.")
    score: float = Field(description="The face's score against the other subjects (margin or cosine), which reached `threshold`.")
    threshold: float = Field(description="The default fpir's threshold for a gallery of the other subjects.")


class DuplicatePairOut(BaseModel):
    """Two subjects that may be one person: /identify would answer `face_id` (of `subject_id`) as `other_subject_id`."""

    face_id: int = Field(description="The face of `subject_id` that scores highest against the other subjects.")
    subject_id: str
    name: str
    other_subject_id: str = Field(description="The subject /identify would answer for that face were its own subject not enrolled.")
    other_name: str
    similarity: float = Field(description="The face's cosine with the other subject's best face.")
    score: float = Field(description="What `threshold` applies to (of the kind `score` names), at or above it.")


class DuplicatesOut(BaseModel):
    pairs: list[DuplicatePairOut] = Field(description="Up to `limit` pairs, each once, highest score first.")
    total: int = Field(description="Pairs at or above the threshold (more than listed when above `limit`).")
    limit: int
    fpir: float = Field(description="The false-positive identification rate the pairs are flagged at.")
    threshold: float = Field(description="That fpir's threshold for a gallery of the other subjects (N − 1).")
    score: Literal["margin", "cosine"] = Field(
        description="What the threshold applies to: the margin score, or without the model's open-set table the cosine."
    )
    subjects: int = Field(description="Subjects whose faces were scored.")
    faces: int = Field(description="Faces scored, each against the other subjects.")


class EnrolledFaceOut(StoredFaceOut):
    quality_warning: str | None = Field(
        None, description="What the quality gate would have refused this face for, when `allow_low_quality` enrolled it anyway."
    )
    possible_duplicate_of: DuplicateOut | None = Field(
        None,
        description="Another subject that /identify, at the default fpir, would answer for this photo if its own subject were not "
        "enrolled: perhaps one person under two ids (`facegate gallery duplicates` lists them all). Null when none.",
    )


class EnrollItem(BaseModel):
    index: int = Field(description="Position of the image in `images`.")
    face: EnrolledFaceOut | None = None
    error: ErrorBody | None = None


class EnrollBulkResponse(BaseModel):
    enrolled: int
    results: list[EnrollItem]


class FacePage(BaseModel):
    faces: list[StoredFaceOut]
