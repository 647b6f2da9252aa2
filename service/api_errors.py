"""Errors the service adds to the pipeline's: each carries its HTTP status and code, so the one
exception handler in `service.api.errors` answers every failure in the same schema."""

from service.errors import FacegateError


class InvalidParameters(FacegateError):
    code = "invalid_parameters"
    status = 422


class UnknownFar(FacegateError):
    code = "unknown_far"
    status = 422


class InvalidBase64(FacegateError):
    code = "invalid_base64"
    status = 422


class UnsupportedMediaType(FacegateError):
    code = "unsupported_media_type"
    status = 415


class LowQualityFace(FacegateError):
    code = "low_quality_face"
    status = 422


class NoEnrolledFaces(FacegateError):
    """Verification against a subject that has no face made by the active embedder."""

    code = "no_enrolled_faces"
    status = 422


class EnrollmentFailed(FacegateError):
    """Bulk enrollment where no image gave a face; `details` says why per image."""

    code = "enrollment_failed"
    status = 422

    def __init__(self, message: str, details: list[dict]):
        super().__init__(message)
        self.details = details


class SubjectNotFound(FacegateError):
    code = "subject_not_found"
    status = 404


class FaceNotFound(FacegateError):
    code = "face_not_found"
    status = 404


class SubjectExists(FacegateError):
    code = "subject_exists"
    status = 409


class ModelUnavailable(FacegateError):
    """A server-side condition (no usable model loaded), not bad input: answered with 503."""

    code = "model_unavailable"
    status = 503


class InvalidJson(FacegateError):
    code = "invalid_json"
    status = 400
