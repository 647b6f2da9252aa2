"""`facegate calibrate-cohort`: a cohort for AS-norm (service/core/models/cohort.py) and its calibration.

The identities given are split once, by a seeded draw: a share of them become the cohort (every
face of theirs), the others the calibration identities, whose impostor pairs — scored against that
cohort, exactly as the service scores — give the normalized score's FAR curve. A cohort person is
never a calibration person, as a user's cohort is never the people they enroll. Identity pairs that
are one person under two names are left out, as `facegate calibrate` leaves them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.core.fileio import sha256_file
from service.core.models.cohort import COHORT_SHARE, TOP, CohortFile, CohortManifest, cohort_stats
from service.core.models.manifest import FarCurve, Manifest
from training.thresholds import far_curve, pair_scores, same_person_pairs


@dataclass
class CohortSplit:
    cohort: np.ndarray  # indices of the cohort's faces
    calibration: np.ndarray  # indices of the calibration identities' faces


def split(labels: np.ndarray, share: float, seed: int) -> CohortSplit:
    identities = np.unique(labels)
    chosen = np.random.default_rng(seed).permutation(identities)[: max(1, round(share * len(identities)))]
    in_cohort = np.isin(labels, chosen)
    if in_cohort.all():
        raise ValueError(f"{len(identities)} identities leave none to calibrate on: give more, or a smaller cohort share")
    return CohortSplit(np.flatnonzero(in_cohort), np.flatnonzero(~in_cohort))


def build(
    embeddings: np.ndarray, labels: np.ndarray, top: int = TOP, share: float = COHORT_SHARE, seed: int = 0
) -> tuple[np.ndarray, dict, dict]:
    """Unit embeddings and their identities → (cohort faces, far_curve of the normalized impostor
    scores, figures for the manifest)."""
    parts = split(np.asarray(labels), share, seed)
    cohort = np.ascontiguousarray(embeddings[parts.cohort], np.float32)
    if len(cohort) < top:
        raise ValueError(f"the cohort has {len(cohort)} faces, fewer than top={top}: give more identities or a smaller --top")
    calibration, calibration_labels = embeddings[parts.calibration], np.asarray(labels)[parts.calibration]
    one_person, report = same_person_pairs(calibration, calibration_labels, pair_scores(calibration, calibration_labels)[1])
    stats = cohort_stats(calibration, cohort, top)
    genuine, impostor = pair_scores(calibration, calibration_labels, stats=stats, one_person=one_person)
    curve = far_curve(impostor)
    figures = {
        "cohort_identities": int(len(np.unique(np.asarray(labels)[parts.cohort]))),
        "cohort_faces": int(len(cohort)),
        "calibration_identities": int(len(np.unique(calibration_labels))),
        "calibration_images": int(len(calibration)),
        "impostor_pairs": int(len(impostor)),
        "genuine_pairs": int(len(genuine)),
        "left_out_as_one_person": report,
    }
    return cohort, curve, figures


def write(
    out: Path, embedder: Manifest, cohort: np.ndarray, curve: dict, top: int, figures: dict, provenance: dict, license_terms: dict
) -> CohortManifest:
    """OUT.npy and its manifest OUT.json (the file FACEGATE_COHORT names)."""
    out = Path(out).with_suffix("")
    npy = out.with_suffix(".npy")
    np.save(npy, cohort)
    manifest = CohortManifest(
        embedder=embedder.name,
        embedder_sha256=embedder.file.sha256,
        file=CohortFile(name=npy.name, sha256=sha256_file(npy), faces=len(cohort)),
        top=top,
        far_curve=FarCurve(**curve),
        metrics=figures,
        provenance=provenance,
        license=license_terms,
    )
    out.with_suffix(".json").write_text(manifest.model_dump_json(indent=2) + "\n")
    return manifest
