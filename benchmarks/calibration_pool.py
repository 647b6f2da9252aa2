"""Whom the cosine rows for many photos per subject are calibrated on (issue 46, ten photos each).

`calibrate-open-set` enrolls a gallery of f faces per subject from the calibration identities with
at least f photos: for 10 faces 635 of the default model's 3,441 training identities, most of them
CFP's and IMFDB's (every photo of every identity still probes as a stranger). Does that pool, rather
than the number of faces, make the 10-face rows stricter than the 5-face ones? Per gallery shape,
the mean's T at FPIR 1e-2 and 1e-3 (benchmarks/subject_templates.py's `calibrated`, drawn as the
command draws them) with the subjects drawn from: every identity with f photos (as shipped), only
those with 10 photos or more (the 10-face rows' pool), and only those of one source (the folder
name's prefix, e.g. `celeba_`). `--write` keeps a copy of `--model`'s manifest whose mean rows for
`--faces` are calibrated on that one source's subjects, for benchmarks/small_galleries.py --model.

    FACEGATE_MODEL_CACHE=../shared/models PYTHONPATH=. .venv/bin/python benchmarks/calibration_pool.py \\
        --calibration /tmp/train-dlib.npz [--sizes 1,2,5] [--faces 5,10] [--source celeba] [--write rows.json]

`--calibration` is an .npz of `embeddings` and `labels` (calibrate-open-set's --cache), or of `emb`
and `labels` as benchmarks/open_set_variants.py's `embeddings` caches `train/`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from benchmarks.subject_templates import RATES, calibrated
from service.core.models.manifest import Manifest
from training.open_set_table import ONE_PERSON_OF_GENUINE, SAMPLES, partners
from training.thresholds import one_person_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibration", type=Path, required=True, help="Embeddings and labels of the calibration identities (.npz).")
    parser.add_argument("--sizes", default="1,2,5")
    parser.add_argument("--faces", default="5,10")
    parser.add_argument("--source", default="celeba", help="The one source's folder-name prefix.")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="Strangers per row.")
    parser.add_argument("--model", type=Path, default=Path(__file__).parents[1] / "models" / "dlib-resnet-v1.json")
    parser.add_argument("--write", type=Path, help="Where to keep the manifest with --faces' rows calibrated on --source's subjects.")
    args = parser.parse_args()
    with np.load(args.calibration) as data:
        emb, names = data["embeddings" if "embeddings" in data else "emb"], data["labels"]
    identities, labels, counts = np.unique(names, return_inverse=True, return_counts=True)  # labels: integers, as the command's
    pairs = partners(labels, one_person_pairs(emb, labels, of_genuine=ONE_PERSON_OF_GENUINE)[0])
    pools = {"f photos": None, "10 photos": counts >= 10, args.source: np.char.startswith(identities.astype(str), args.source)}
    print("\n".join(machine_lines()))
    print(f"{args.calibration.name}: {len(labels):,} photos of {len(identities):,} identities, {args.samples:,} strangers a row")
    print("| f × N | subjects from | identities | T at 1e-2 | T at 1e-3 |\n| --- | --- | --- | --- | --- |")
    for faces in (int(f) for f in args.faces.split(",")):
        for size in (int(n) for n in args.sizes.split(",")):
            for name, pool in pools.items():
                eligible = int(((counts >= faces) & (True if pool is None else pool)).sum())
                t = calibrated(emb, labels, size, faces, "mean", pairs, args.samples, 0, pool)
                print(f"| {faces} × {size} | {name} | {eligible} | {t[RATES[0]]:.4f} | {t[RATES[1]]:.4f} |", flush=True)
    if args.write:
        write(
            Manifest.load(args.model),
            args.write,
            [int(f) for f in args.faces.split(",")],
            emb,
            labels,
            pairs,
            pools[args.source],
            args.samples,
        )


def write(manifest: Manifest, path: Path, faces: list[int], emb, labels, pairs, pool, samples: int) -> None:
    """The manifest with its mean rows for `faces` calibrated on `pool`'s subjects, every table size and FPIR."""
    table = manifest.open_set
    assert table is not None and table.cosine_template == "mean"
    tables = []
    for rows in table.cosine_tables:
        if rows.faces_per_subject in faces:
            by_size = [
                calibrated(emb, labels, n, rows.faces_per_subject, "mean", pairs, samples, 0, pool, table.fpirs) for n in rows.subjects
            ]
            rows = rows.model_copy(update={"thresholds": [np.maximum.accumulate([t[q] for q in table.fpirs]).tolist() for t in by_size]})
        tables.append(rows)
    manifest.model_copy(update={"open_set": table.model_copy(update={"cosine_tables": tables})}).save(path)


if __name__ == "__main__":
    main()
