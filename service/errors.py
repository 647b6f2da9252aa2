"""Typed errors for bad input and unusable models.

Input errors carry the machine-readable `code` and HTTP status the API answers with, so the
pipeline decides what is the caller's fault and the API only translates.
"""


class FacegateError(Exception):
    """Base of all errors caused by the caller's input."""

    code = "bad_request"
    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidImage(FacegateError):
    code = "invalid_image"
    status = 400


class ImageTooSmall(FacegateError):
    code = "image_too_small"
    status = 422


class ImageTooLarge(FacegateError):
    code = "image_too_large"
    status = 413


class UnsupportedImage(FacegateError):
    code = "unsupported_image"
    status = 415


class InvalidCrop(FacegateError):
    """An image sent as already aligned does not have the template's size."""

    code = "invalid_aligned_crop"
    status = 422


class NoFace(FacegateError):
    code = "no_face"
    status = 422


class MultipleFaces(FacegateError):
    code = "multiple_faces"
    status = 422


class ModelError(RuntimeError):
    """A model file is missing, corrupt or does not match its manifest: a start-up error."""
