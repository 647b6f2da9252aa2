"""`facegate calibrate-open-set`: the margin score's table T_sim(N, q) (service/core/open_set.py),
from identity folders the model never trained on.

For each gallery size N of a log grid, galleries of N calibration identities are drawn again and
again (seeded), each enrolled by `faces` random photos of each; every photo of every identity left
out probes as a stranger, its S computed exactly as the service computes it (the best face of each
subject, `margin_scores`). T_sim(N, q) is the threshold just above the ⌊q · n⌋ + 1-th highest of
the n stranger scores gathered at that size (the (1 − q) quantile, as `calibrate` fits a FAR).
Draws go on until each size has SAMPLES stranger scores, so every FPIR of the table rests on at
least MIN_FALSE_ACCEPTS of them, from at least GALLERIES galleries and GALLERY_FACES enrolled faces
in all (a gallery of one or ten faces is a small sample of faces, and some faces score high
against everyone: a small gallery's tail is theirs).

Identity pairs that are one person under two names are left out: such a stranger is not compared
with that subject. Beside `calibrate`'s rule (half their cross pairs above the FAR-1e-4 threshold),
a pair whose photos match there at least ONE_PERSON_OF_GENUINE times as often as one identity's own
photos do (and in 3 cross pairs at least) is one person too (`thresholds.same_person_pairs`,
`of_genuine`): the table is far more sensitive to them than a pair's FAR. In a gallery of 2,000 of
the default model's 3,441 training identities, the strangers whose other name is enrolled are a few
percent of all strangers, and pass: celebrities that are in both CelebA and CFP (a CFP identity's 4
profile photos keep its share with the CelebA one under half) made T(2,000, 1e-2) 0.970447 with
calibrate's 120 pairs left out, 0.966436 with this rule's 298.

A size is in the grid while it leaves at least max(MIN_STRANGER_IDENTITIES, STRANGER_SHARE of the
identities) to probe as strangers; one table per `faces` value (subjects with one face, and with
several: the table for 3 is read for galleries with about 3 faces per subject). Beside them, the
cosine rows: the same draws scored by the best subject's cosine alone, for galleries up to
COSINE_BELOW subjects (one table per `cosine_faces` value), which decide galleries below it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.core.models.manifest import Manifest, OpenSetRows, OpenSetTable, Template
from service.core.open_set import K, margin_scores, mean_template
from service.core.settings import Settings
from training.pair_evaluation import OnnxEmbedder
from training.thresholds import MIN_FALSE_ACCEPTS, cached_embeddings, heldout_source, just_above, one_person_pairs

SIZES = (1, 2, 3, 5, 7, 11, 15, 20, 30, 50, 100, 200, 300, 500, 1000, 2000, 3000)
FPIRS = (0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 5e-3, 2e-3, 1e-3, 5e-4, 2e-4, 1e-4)
SAMPLES = 200_000  # stranger scores per gallery size: 20 above the threshold of the smallest FPIR
GALLERIES = 200  # at least this many galleries per size
GALLERY_FACES = 20_000  # and enough to enroll this many faces in all (10 strangers each at least): a small gallery's faces set its tail
MIN_STRANGER_IDENTITIES = 50
STRANGER_SHARE = 0.1
CHUNK = 2048  # strangers scored in one matrix product
COSINE_BELOW = 31  # galleries below: the best cosine decides (a home's 1-30 people: on LFW it names fewer strangers, docs/api.md)
COSINE_FACES = (1, 3, 5, 10)  # faces per subject of the cosine rows: a home gallery is a few people with a few photos each
ONE_PERSON_OF_GENUINE = 0.5  # identity pairs whose photos match at half the rate one person's do are one person (see above)


@dataclass
class Draws:
    """The stranger scores of one gallery size."""

    scores: np.ndarray
    galleries: int


def stranger_scores(
    embeddings: np.ndarray,
    labels: np.ndarray,
    size: int,
    faces: int,
    rng: np.random.Generator,
    samples: int,
    one_person: dict[int, set[int]] | None = None,
    cosine: bool = False,
    template: Template = "best_face",
) -> Draws:
    """S (`cosine`: the best subject's cosine) of the photos of the identities outside a drawn gallery
    of `size` identities enrolled by `faces` photos each (a draw of them per gallery), over as many
    galleries as `samples` scores take: at least GALLERIES, and enough to enroll GALLERY_FACES faces
    in all (each probed by at least 10 strangers). A subject's cosine is its best face's, or with
    `template` "mean" the cosine with its faces' mean (`mean_template`), the same draws either way."""
    identities, inverse = np.unique(np.asarray(labels), return_inverse=True)
    photos = np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])
    eligible = np.array([i for i, p in enumerate(photos) if len(p) >= faces])
    one_person = one_person or {}
    partnered = np.array(sorted(one_person), np.int64)
    gathered: list[np.ndarray] = []
    count, galleries = 0, 0
    take = min(K + 1, size)
    scored = 1 if cosine else size  # the margin score of one subject is its cosine
    per_gallery = -(-samples // max(GALLERIES, min(samples // 10, -(-GALLERY_FACES // (size * faces)))))
    while count < samples:
        chosen = rng.choice(eligible, size, replace=False)
        column = dict(zip(chosen.tolist(), range(size), strict=True))
        gallery = embeddings[np.concatenate([rng.choice(photos[i], faces, replace=False) for i in chosen])]
        if template == "mean":
            gallery, per_subject = mean_template(gallery.reshape(size, faces, -1)), 1
        else:
            per_subject = faces
        outside = np.ones(len(identities), bool)
        outside[chosen] = False
        probes = np.flatnonzero(outside[inverse])
        probes = rng.choice(probes, min(len(probes), per_gallery), replace=False)
        for start in range(0, len(probes), CHUNK):
            batch = probes[start : start + CHUNK]
            best = (embeddings[batch] @ gallery.T).reshape(len(batch), size, per_subject).max(axis=2)  # each subject's best face, or mean
            top = -np.sort(-np.partition(best, size - take, axis=1)[:, size - take :], axis=1)
            scores = margin_scores(top, scored)
            for row in np.flatnonzero(np.isin(inverse[batch], partnered)):
                # one person under two names: that subject is not compared with this stranger
                masked = [column[o] for o in one_person[int(inverse[batch[row]])] if o in column]
                if masked:
                    kept = np.delete(best[row], masked)
                    scores[row] = margin_scores(-np.sort(-kept)[None, :take], min(scored, len(kept)))[0] if len(kept) else -np.inf
            gathered.append(scores)
        count += len(probes)
        galleries += 1
    scores = np.concatenate(gathered)
    return Draws(scores[np.isfinite(scores)], galleries)


def threshold_at(scores: np.ndarray, fpir: float) -> float:
    """The smallest threshold (score ≥ it accepts) that accepts at most ⌊fpir · n⌋ of the scores."""
    allowed = math.floor(fpir * len(scores) + 1e-9)
    return just_above(float(np.partition(scores, len(scores) - allowed - 1)[len(scores) - allowed - 1]))


def sizes_for(labels: np.ndarray, faces: int, sizes=SIZES) -> list[int]:
    """The grid's sizes these identities support with `faces` photos enrolled per subject."""
    counts = np.unique(np.asarray(labels), return_counts=True)[1]
    spare = max(MIN_STRANGER_IDENTITIES, math.ceil(STRANGER_SHARE * len(counts)))
    return [n for n in sizes if n <= (counts >= faces).sum() and len(counts) - n >= spare]


def partners(labels: np.ndarray, one_person: Sequence[tuple[int, int]]) -> dict[int, set[int]]:
    """Per identity (its index among the sorted labels), the identities that are the same person."""
    pairs: dict[int, set[int]] = {}
    identities = np.unique(labels)
    for a, b in one_person:
        ia, ib = int(np.searchsorted(identities, a)), int(np.searchsorted(identities, b))
        pairs.setdefault(ia, set()).add(ib)
        pairs.setdefault(ib, set()).add(ia)
    return pairs


def rows_for(
    embeddings: np.ndarray,
    labels: np.ndarray,
    faces: int,
    usable: Sequence[float],
    cosine: bool = False,
    seed: int = 0,
    samples: int = SAMPLES,
    pairs: dict[int, set[int]] | None = None,
    sizes=SIZES,
    cosine_below: int = COSINE_BELOW,
    progress=None,
    template: Template = "best_face",
) -> OpenSetRows:
    """One table: the thresholds at `usable` FPIRs per gallery size of `faces` faces per subject, of
    the margin score or (`cosine`) of the best subject's cosine (against its `template`), for sizes up
    to the first at or above `cosine_below`."""
    grid = sizes_for(labels, faces, sizes)
    if cosine:
        grid = [n for n in grid if n < cosine_below] + [n for n in grid if n >= cosine_below][:1]
    if len(grid) < 2:
        raise ValueError(f"{len(np.unique(labels))} identities are too few for galleries enrolled by {faces} photos each")
    rows, counts = [], []
    for size in grid:
        rng = np.random.default_rng([seed, faces, size])  # the cosine rows score the margin rows' galleries
        draws = stranger_scores(embeddings, labels, size, faces, rng, samples, pairs, cosine, template if cosine else "best_face")
        rows.append([threshold_at(draws.scores, q) for q in usable])
        counts.append(len(draws.scores))
        if progress:
            progress(faces, size, draws)
    for row in rows:  # a quantile of fewer scores can come out a hair below the next coarser one's
        for j in range(1, len(row)):
            row[j] = max(row[j], row[j - 1])
    return OpenSetRows(faces_per_subject=faces, subjects=grid, thresholds=rows, samples=counts)


def usable_fpirs(samples: int, fpirs=FPIRS) -> list[float]:
    """The FPIRs `samples` stranger scores resolve (MIN_FALSE_ACCEPTS above each threshold)."""
    return [q for q in fpirs if math.floor(q * samples + 1e-9) >= MIN_FALSE_ACCEPTS]


def build(
    embeddings: np.ndarray,
    labels: np.ndarray,
    faces_per_subject=(1, 3),
    seed: int = 0,
    samples: int = SAMPLES,
    one_person: Sequence[tuple[int, int]] = (),
    fpirs=FPIRS,
    sizes=SIZES,
    progress=None,
    cosine_faces=COSINE_FACES,
    cosine_below: int = COSINE_BELOW,
    template: Template = "best_face",
) -> OpenSetTable:
    """The table, one set of rows per faces-per-subject value (rows end where `sizes_for` does), and
    the cosine rows (of `template`) for galleries up to `cosine_below` subjects, for the `cosine_faces`
    values enough identities have photos for (a gallery with more faces per subject reads the last of them)."""
    usable, pairs = usable_fpirs(samples, fpirs), partners(labels, one_person)
    cosine_tables = cosine_rows(embeddings, labels, usable, seed, samples, pairs, sizes, progress, cosine_faces, cosine_below, template)
    return OpenSetTable(
        fpirs=usable,
        tables=[
            rows_for(embeddings, labels, f, usable, False, seed, samples, pairs, sizes, cosine_below, progress) for f in faces_per_subject
        ],
        cosine_below=cosine_below if cosine_tables else 0,
        cosine_tables=cosine_tables,
        cosine_template=template,
    )


def cosine_rows(
    embeddings: np.ndarray,
    labels: np.ndarray,
    usable: Sequence[float],
    seed: int,
    samples: int,
    pairs: dict[int, set[int]],
    sizes=SIZES,
    progress=None,
    cosine_faces=COSINE_FACES,
    cosine_below: int = COSINE_BELOW,
    template: Template = "best_face",
) -> list[OpenSetRows]:
    """The best subject's cosine rows (against its `template`) for the `cosine_faces` values enough
    identities have photos for."""
    faces = [f for f in cosine_faces if len(sizes_for(labels, f, sizes)) >= 2]  # the data's
    return [rows_for(embeddings, labels, f, usable, True, seed, samples, pairs, sizes, cosine_below, progress, template) for f in faces]


def with_cosine_rows(
    table: OpenSetTable,
    cosine_tables: list[OpenSetRows],
    calibration: dict,
    template: Template = "best_face",
    cosine_below: int = COSINE_BELOW,
) -> OpenSetTable:
    """A manifest's table, its margin rows kept, deciding galleries below `cosine_below` subjects on
    these cosine rows of `template` (calibrated at its FPIRs; `calibration` says on what)."""
    if not cosine_tables:
        raise ValueError("the identities are too few for any cosine rows")
    return table.model_copy(
        update={
            "cosine_below": cosine_below,
            "cosine_tables": cosine_tables,
            "cosine_template": template,
            "calibration": {**table.calibration, "cosine_rows": calibration},
        }
    )


def calibrate(
    manifest_path: Path,
    settings: Settings,
    data: Path | None = None,
    faces_per_subject=(1, 3),
    seed: int = 0,
    samples: int = SAMPLES,
    cache: Path | None = None,
    write: bool = True,
    progress=None,
    cosine_faces=COSINE_FACES,
    cosine_only: bool = False,
    template: Template = "best_face",
    embedded: Path | None = None,
    cosine_below: int = COSINE_BELOW,
) -> tuple[OpenSetTable, str]:
    """Embed the calibration identities as the service does (`data`, else the model's held-out
    ones; or read them embedded already, `embedded`), leave out identity pairs that are one person,
    build the table and (unless write=False) store it in the manifest's `open_set`; `cosine_only`:
    the manifest's margin rows kept, its cosine rows (re)calibrated for `template`."""
    if embedded is not None:
        manifest = Manifest.load(manifest_path)
        embeddings, labels, origin = read_embedded(embedded, manifest)
    else:
        embedder = OnnxEmbedder(manifest_path, settings)
        manifest = embedder.model.manifest
        source, origin = heldout_source(manifest, data)
        embeddings, labels = cached_embeddings(embedder, source, origin, cache)
    if cosine_only and manifest.open_set is None:
        raise ValueError(f"{manifest.name} has no open-set table to add cosine rows to: calibrate it without --cosine-only")
    one_person, report = one_person_pairs(embeddings, labels, of_genuine=ONE_PERSON_OF_GENUINE)
    calibration = {
        "source": origin,
        "identities": int(len(np.unique(labels))),
        "images": int(len(labels)),
        "seed": seed,
        "samples_per_size": samples,
        "left_out_as_one_person": report,
    }
    if cosine_only and manifest.open_set is not None:
        kept = manifest.open_set
        if kept.fpirs != usable_fpirs(samples):
            raise ValueError(f"--samples {samples:,} resolves other FPIRs than the table's {kept.fpirs}: give the samples it was made with")
        pairs = partners(labels, one_person)
        rows = cosine_rows(
            embeddings,
            labels,
            kept.fpirs,
            seed,
            samples,
            pairs,
            progress=progress,
            cosine_faces=cosine_faces,
            cosine_below=cosine_below,
            template=template,
        )
        table = with_cosine_rows(kept, rows, calibration, template, cosine_below)
    else:
        table = build(
            embeddings,
            labels,
            faces_per_subject,
            seed,
            samples,
            one_person,
            progress=progress,
            cosine_faces=cosine_faces,
            cosine_below=cosine_below,
            template=template,
        )
        table.calibration = calibration
    if write:
        stored = Manifest.load(manifest_path)
        stored.open_set = table
        stored.save(manifest_path)
    return table, origin


def read_embedded(path: Path, manifest: Manifest) -> tuple[np.ndarray, np.ndarray, str]:
    """Calibration identities embedded already: an .npz of `embeddings` (unit rows of the model's
    dimension) and `labels`, as --cache keeps them, with an optional `origin` naming where they come
    from (else the file's name): how rows are added to a model's table on the very embeddings its
    other rows were calibrated on."""
    with np.load(path) as data:
        embeddings, labels = np.asarray(data["embeddings"], np.float32), np.asarray(data["labels"])
        origin = str(data["origin"]) if "origin" in data.files else f"the embeddings in {path.name}"
    if embeddings.ndim != 2 or embeddings.shape[1] != manifest.embedding_dim or len(labels) != len(embeddings):
        raise ValueError(
            f"{path}: {embeddings.shape} embeddings and {len(labels)} labels are not {manifest.name}'s {manifest.embedding_dim}-d rows"
        )
    return embeddings, labels, origin
