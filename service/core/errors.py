"""Every error the service answers with, in one tree rooted at `FacegateError`.

Each class carries its HTTP status and its machine-readable `code`, so code anywhere (pipeline,
gallery, request parsing) says what went wrong and the API only translates: no handler or
middleware spells a code. `error_for_status` names the class for a bare HTTP status (routing
errors, the body limit), and `all_errors` lists the tree for the docs' error table.
"""

from __future__ import annotations


class FacegateError(Exception):
    """Root of the tree. A 4xx is the caller's fault; a 5xx for bad input is a bug."""

    code: str
    status: int
    details: list[dict] | None = None  # per-item errors (bulk enrollment) or failed checks (low_quality_face)
    retry_after: int | None = None  # seconds: sent as Retry-After (a 503 that will pass)

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# 400


class BadRequest(FacegateError):
    """A request the HTTP layer could not read (e.g. a malformed multipart body)."""

    code, status = "bad_request", 400


class InvalidImage(FacegateError):
    code, status = "invalid_image", 400


class InvalidJson(FacegateError):
    code, status = "invalid_json", 400


class MissingImage(FacegateError):
    """A CompreFace request without its image part (CompreFace's 400, code 34)."""

    code, status = "missing_image", 400


# 401, 404, 405, 409


class Unauthorized(FacegateError):
    code, status = "unauthorized", 401


class RequestTimeout(FacegateError):
    """The request body did not arrive within FACEGATE_BODY_TIMEOUT seconds."""

    code, status = "request_timeout", 408


class NotFound(FacegateError):
    """No such route."""

    code, status = "not_found", 404


class SubjectNotFound(FacegateError):
    code, status = "subject_not_found", 404


class FaceNotFound(FacegateError):
    code, status = "face_not_found", 404


class FaceChipNotStored(FacegateError):
    """The face exists, but was enrolled while FACEGATE_STORE_CROPS was off: no image of it is kept."""

    code, status = "face_chip_not_stored", 404


class MethodNotAllowed(FacegateError):
    code, status = "method_not_allowed", 405


class SubjectExists(FacegateError):
    code, status = "subject_exists", 409


# 413, 415, 431


class BodyTooLarge(FacegateError):
    code, status = "body_too_large", 413


class ImageTooLarge(FacegateError):
    code, status = "image_too_large", 413


class HeadersTooLarge(FacegateError):
    """The request line and headers exceed FACEGATE_H11_MAX_INCOMPLETE_EVENT_SIZE bytes."""

    code, status = "headers_too_large", 431


class UnsupportedMediaType(FacegateError):
    """A body that is neither multipart nor JSON, or an image format the decoder refuses."""

    code, status = "unsupported_media_type", 415


# 422


class InvalidParameters(FacegateError):
    code, status = "invalid_parameters", 422


class UnknownFar(FacegateError):
    code, status = "unknown_far", 422


class InvalidBase64(FacegateError):
    code, status = "invalid_base64", 422


class ImageTooSmall(FacegateError):
    code, status = "image_too_small", 422


class ImageTooComplex(FacegateError):
    """An image whose decoding would cost far more than its pixels: a JPEG with more than 100 scans
    or 1,000 marker segments, or any image still decoding after FACEGATE_DECODE_TIMEOUT seconds
    (its decoder process is then stopped)."""

    code, status = "image_too_complex", 422


class InvalidCrop(FacegateError):
    """An image sent as already aligned does not have the template's size."""

    code, status = "invalid_aligned_crop", 422


class NoFace(FacegateError):
    code, status = "no_face", 422


class MultipleFaces(FacegateError):
    code, status = "multiple_faces", 422


class TooManyFaces(FacegateError):
    """More faces than FACEGATE_MAX_FACES, or faces × top_k above FACEGATE_MAX_IDENTIFY_CANDIDATES:
    bounds the work and the answer one image can cost."""

    code, status = "too_many_faces", 422


class LowQualityFace(FacegateError):
    """Enrollment's quality gate (service/core/quality.py) refused the face; `details` names each
    check it failed (`check`, the measured `value`, its `limit`)."""

    code, status = "low_quality_face", 422

    def __init__(self, message: str, details: list[dict] | None = None):
        super().__init__(message)
        self.details = details


class NoEnrolledFaces(FacegateError):
    """Verification against a subject that has no face made by the active embedder."""

    code, status = "no_enrolled_faces", 422


class EnrollmentFailed(FacegateError):
    """Bulk enrollment where no image gave a face; `details` says why per image."""

    code, status = "enrollment_failed", 422

    def __init__(self, message: str, details: list[dict]):
        super().__init__(message)
        self.details = details


# 5xx: the server's condition, never the caller's input


class Overloaded(FacegateError):
    """FACEGATE_MAX_INFLIGHT_REQUESTS requests are already being served, or a budget stayed spent:
    retry after Retry-After (its answer always carries one)."""

    code, status = "overloaded", 503
    retry_after = 1  # seconds


class DecoderFailed(Overloaded):
    """A decoder process died mid-job (killed from outside, or its decoder crashed) while what is known
    of the image fits its memory limit: the server's fault, not the image's, so a 503 with Retry-After
    (a fresh process takes the next image). Where the image's size is the likely cause: 413
    image_too_large."""

    code, status = "decoder_failed", 503


class InternalError(FacegateError):
    """An unexpected exception (logged)."""

    code, status = "internal_error", 500


class ModelError(FacegateError):
    """A model file is missing, corrupt or does not match its manifest: raised at start-up and by
    the CLI, which say why; the service then starts without the model (see ModelUnavailable)."""

    code, status = "model_error", 503


class ModelUnavailable(FacegateError):
    """A request that needs a model while none usable is loaded; with `retry_after` when that will
    pass by itself (a warm-up, the model host restarting)."""

    code, status = "model_unavailable", 503

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class GalleryLoading(FacegateError):
    """The gallery's index and open-set guard are still being built at start-up (the port listens
    meanwhile): retry after Retry-After."""

    code, status = "gallery_loading", 503
    retry_after = 2  # seconds


class GalleryUnavailable(FacegateError):
    """The gallery's database (PostgreSQL, FACEGATE_DATABASE_URL) or its vector database (Milvus,
    FACEGATE_MILVUS_URI) cannot be reached just now."""

    code, status = "gallery_unavailable", 503


class ExtraNotInstalled(GalleryUnavailable):
    """The gallery's settings need an optional extra (the PostgreSQL driver, Milvus' client) this
    installation lacks: unavailable until it is installed, so start-up does not try again."""

    code = "extra_not_installed"


class DuplicatesUnavailable(FacegateError):
    """GET /gallery/duplicates on a gallery that keeps no open-set guard and is too large to score
    per request, or whose guard lists a sample of its faces asked for every pair, or for a subject of
    too many faces to search per request: `facegate gallery duplicates` lists its pairs."""

    code, status = "duplicates_unavailable", 503


class StorageFull(FacegateError):
    """The gallery's disk (or the PostgreSQL server's) is full: the write was rolled back, nothing
    changed; it succeeds again once space is freed, without a restart."""

    code, status = "storage_full", 507


_FOR_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    408: RequestTimeout,
    405: MethodNotAllowed,
    413: BodyTooLarge,
    415: UnsupportedMediaType,
    431: HeadersTooLarge,
    422: InvalidParameters,
    500: InternalError,
    503: ModelUnavailable,
}


def error_for_status(status: int) -> type[FacegateError]:
    """The class answering a bare HTTP status; another 4xx is a bad request, another 5xx internal."""
    return _FOR_STATUS.get(status, BadRequest if status < 500 else InternalError)


def all_errors() -> list[type[FacegateError]]:
    """Every concrete error class, in the order they are declared here."""
    return [c for c in globals().values() if isinstance(c, type) and issubclass(c, FacegateError) and c is not FacegateError]
