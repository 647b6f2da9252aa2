"""Score normalization against a cohort (AS-norm): a stranger is matched when the best of N
comparisons is high *for that probe and that enrolled face*. Some faces score high against
everyone (hubs: low light, a common pose, a child's face); a raw cosine threshold lets them through
first. Each side's score is standardized by the mean and spread of its `top` highest similarities
to a fixed cohort of other people's faces, and the two are averaged:

    s' = ½ · ((s − μ_probe) / σ_probe + (s − μ_face) / σ_face)

The cohort comes with the impostor curve of s' calibrated on identities outside it, so /identify's
FPIR keeps its meaning. A cohort is built from real faces (`facegate calibrate-cohort`): its
embeddings are personal data under the terms of the photos they came from, so none ships in
models/; FACEGATE_COHORT names one the operator built (docs/api.md, cohort-normalized scores)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from service.core.errors import ModelError
from service.core.fileio import sha256_file
from service.core.models.manifest import FarCurve, Manifest, far_at, threshold_at
from service.core.strict import StrictModel

TOP = 200  # a face's highest cohort cosines that give its mean and spread (chosen on a development open set: docs/models/dlib-resnet-v1.md)
COHORT_SHARE = 1 / 3  # of the identities `facegate calibrate-cohort` is given, the share that becomes the cohort


class CohortFile(StrictModel):
    name: str = Field(description="A .npy of float32 unit embeddings (cohort faces × embedding_dim), beside this manifest.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    faces: int = Field(gt=0)


class CohortManifest(StrictModel):
    """What `facegate calibrate-cohort` writes beside the cohort's .npy."""

    schema_version: Literal[1] = 1
    method: Literal["as-norm"] = "as-norm"
    embedder: str = Field(description="The embedder manifest's name the cohort was embedded with.")
    embedder_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    file: CohortFile
    top: int = Field(gt=1, description="How many of a face's highest cohort similarities give its mean and spread.")
    far_curve: FarCurve = Field(description="Per-comparison FAR ↔ normalized score, from impostor pairs of identities outside the cohort.")
    metrics: dict[str, Any] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=dict)
    license: dict[str, str]


@dataclass(frozen=True)
class Cohort:
    manifest: CohortManifest
    faces: np.ndarray  # (n, dim) float32, unit rows

    @classmethod
    def load(cls, path: Path, embedder: Manifest) -> Cohort:
        """The cohort manifest at `path` and its verified .npy, refused unless made with `embedder`."""
        path = Path(path)
        try:
            manifest = CohortManifest.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            raise ModelError(f"cohort manifest not found: {path}") from None
        except ValueError as exc:
            raise ModelError(f"invalid cohort manifest {path}: {exc}") from None
        if (manifest.embedder, manifest.embedder_sha256) != (embedder.name, embedder.file.sha256):
            raise ModelError(
                f"cohort {path} was embedded with {manifest.embedder} ({manifest.embedder_sha256[:12]}), "
                f"the service runs {embedder.name} ({embedder.file.sha256[:12]}): rebuild it with `facegate calibrate-cohort`"
            )
        file = path.parent / manifest.file.name
        if not file.is_file():
            raise ModelError(f"cohort file not found: {file}")
        if sha256_file(file) != manifest.file.sha256:
            raise ModelError(f"{file}: sha256 does not match cohort manifest {path}")
        faces = np.load(file, allow_pickle=False)
        if faces.dtype != np.float32 or faces.shape != (manifest.file.faces, embedder.embedding_dim) or manifest.top > len(faces):
            raise ModelError(
                f"{file}: {faces.dtype} {faces.shape}, the manifest promises float32 ({manifest.file.faces}, {embedder.embedding_dim}) "
                f"and top {manifest.top} ≤ faces"
            )
        return cls(manifest, faces)

    def stats(self, embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's mean and spread over its `top` highest cosines to the cohort."""
        return cohort_stats(np.atleast_2d(embeddings), self.faces, self.manifest.top)

    def normalize(self, probe: np.ndarray, faces: np.ndarray, cosines: np.ndarray) -> np.ndarray:
        """AS-norm scores of one probe against `faces` (k × dim), whose cosines to it are `cosines`."""
        (probe_mean,), (probe_spread,) = self.stats(probe)
        return as_norm(np.asarray(cosines), (probe_mean, probe_spread), self.stats(faces))

    def threshold_at(self, far: float) -> float:
        return threshold_at(self.manifest.far_curve.curve, far)

    def far_at(self, score: float) -> float:
        return far_at(self.manifest.far_curve.curve, score)

    def beyond_calibration(self, far: float) -> bool:
        return far < self.manifest.far_curve.points[-1][0]


def as_norm(cosines: np.ndarray, probe_stats: tuple, face_stats: tuple) -> np.ndarray:
    """½ · ((s − μ_probe) / σ_probe + (s − μ_face) / σ_face), elementwise: the one formula the
    service decides with and training calibrates with."""
    (probe_mean, probe_spread), (face_mean, face_spread) = probe_stats, face_stats
    return 0.5 * ((cosines - probe_mean) / probe_spread + (cosines - face_mean) / face_spread)


def cohort_stats(embeddings: np.ndarray, cohort: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """(means, spreads) of each row's `top` highest cosines to `cohort`; a spread is never below
    1e-6, so a degenerate cohort cannot divide by zero. Training calibrates with this very function."""
    scores = np.asarray(embeddings, np.float32) @ cohort.T
    best = np.partition(scores, scores.shape[1] - top, axis=1)[:, -top:]
    return best.mean(axis=1), np.maximum(best.std(axis=1), 1e-6)
