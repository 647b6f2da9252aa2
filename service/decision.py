"""Which threshold decides a match: an explicit cosine, or the manifest's threshold for a
false-accept rate (the request's, else FACEGATE_DEFAULT_FAR)."""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import InvalidParameters, UnknownFar
from service.models.manifest import Manifest, far_key


@dataclass(frozen=True)
class Decision:
    threshold: float
    far: str | None  # None when the caller gave an explicit threshold

    def matches(self, similarity: float) -> bool:
        return similarity >= self.threshold


def decide(manifest: Manifest, far: float | str | None, threshold: float | None, default_far: str) -> Decision:
    if far is not None and threshold is not None:
        raise InvalidParameters("give far or threshold, not both")
    if threshold is not None:
        return Decision(threshold, None)
    try:
        key = far_key(far if far is not None else default_far)
    except ValueError as exc:
        raise InvalidParameters(f"far: {exc}") from None
    try:
        return Decision(manifest.threshold(key), key)
    except KeyError:
        origin = "requested" if far is not None else "default (FACEGATE_DEFAULT_FAR)"
        available = ", ".join(sorted(manifest.thresholds, key=float)) or "none (pass an explicit threshold)"
        raise UnknownFar(f"the model has no threshold for the {origin} FAR {key}; available FARs: {available}") from None
