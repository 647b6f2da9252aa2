"""Classification heads for face-recognition training: softmax and every margin-based softmax.

`build_head(name, embedding_dim, num_classes, **params)` returns an `nn.Module` with a `weight`
parameter (num_classes × embedding_dim; sub-center: num_classes·k rows, class-major) whose
`forward(embeddings, labels)` gives float32 logits ready for `F.cross_entropy` and whose
`loss(embeddings, labels)` is the full training loss. Formulas and defaults: docs/heads.md
("Formulas and defaults").
"""

from __future__ import annotations

import inspect
from typing import Any

from training.heads.adaptive import AdaCos, AdaFace, CurricularFace, MagFace
from training.heads.additive import ArcFace, CombinedMargin, CosFace, SubCenterArcFace, angular_margin, cosface_scale_lower_bound
from training.heads.base import EPS, IGNORE_INDEX, Head
from training.heads.multiplicative import LSoftmax, SphereFace, chebyshev_cos, lambda_schedule, psi
from training.heads.plain import ModifiedSoftmax, NormFace, Softmax

# name → (class, defaults that differ from the class's own); parameters are Any: each class takes its own,
# checked against its signature at run time (build_head)
_REGISTRY: dict[str, tuple[type[Head], dict[str, Any]]] = {
    "softmax": (Softmax, {}),
    "msoftmax": (ModifiedSoftmax, {}),
    "normface": (NormFace, {}),
    "lsoftmax": (LSoftmax, {}),
    "sphereface": (SphereFace, {}),
    "amsoftmax": (CosFace, {"s": 30.0}),
    "cosface": (CosFace, {}),
    "arcface": (ArcFace, {}),
    "combined": (CombinedMargin, {}),
    "adacos": (AdaCos, {}),
    "subcenter_arcface": (SubCenterArcFace, {}),
    "curricularface": (CurricularFace, {}),
    "magface": (MagFace, {}),
    "adaface": (AdaFace, {}),
}

HEADS: tuple[str, ...] = tuple(_REGISTRY)


def head_params(name: str) -> dict[str, Any]:
    """The parameters `name` accepts, with their defaults."""
    cls, overrides = _lookup(name)
    signature = inspect.signature(cls.__init__).parameters
    defaults = {
        key: p.default
        for key, p in signature.items()
        if key not in ("self", "embedding_dim", "num_classes", "rows") and p.default is not inspect.Parameter.empty
    }
    return defaults | overrides


def build_head(name: str, embedding_dim: int, num_classes: int, **params: Any) -> Head:
    """The head `name` (one of HEADS) with its defaults, overridden by `params`."""
    cls, _ = _lookup(name)
    accepted = head_params(name)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)} for head {name!r}; it accepts: {', '.join(accepted) or 'none'}")
    return cls(embedding_dim, num_classes, **(accepted | params))


def _lookup(name: str) -> tuple[type[Head], dict[str, Any]]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown head {name!r}; choose one of: {', '.join(HEADS)}") from None


__all__ = [
    "EPS",
    "HEADS",
    "IGNORE_INDEX",
    "AdaCos",
    "AdaFace",
    "ArcFace",
    "CombinedMargin",
    "CosFace",
    "CurricularFace",
    "Head",
    "LSoftmax",
    "MagFace",
    "ModifiedSoftmax",
    "NormFace",
    "Softmax",
    "SphereFace",
    "SubCenterArcFace",
    "angular_margin",
    "build_head",
    "chebyshev_cos",
    "cosface_scale_lower_bound",
    "head_params",
    "lambda_schedule",
    "psi",
]
