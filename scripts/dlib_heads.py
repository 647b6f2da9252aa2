"""The heads comparison of docs/dlib-finetune.md: every head fine-tunes dlib-resnet-v1's last stages
on the same prefix cache, with the same recipe and number of steps; only `head` changes.

    python scripts/dlib_heads.py cache  WORK [--stages 4 5]   # prefix caches (resumable)
    python scripts/dlib_heads.py run    WORK [--only arcface] # each head's run (resumable), + baseline
    python scripts/dlib_heads.py table  WORK                  # the markdown table and the plot

WORK holds cache-k<N>/ and runs/<label>/ (last.pt, best.pt, best.json, result.json). Every step
resumes where it stopped, so the comparison can span sessions. The held-out identities (data.val_fraction,
seed) are the only data any choice here is made on; LFW is evaluated afterwards, on the chosen run.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from cached_finetune import CachedRun, build_cache  # beside this script (its sys.path[0])

from service.core.settings import get_settings
from training.config import load_config

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "dlib-finetune.yaml"

# label → (head, params): the seven heads of the issue. One scale, s = 30, for every normalized head
# (3,097 training identities: the papers' s = 64 is for 85k); margins at the papers' values.
HEADS = {
    "softmax": ("softmax", {}),
    "normface": ("normface", {"s": 30.0}),
    "sphereface": ("sphereface", {}),
    "cosface": ("cosface", {"s": 30.0, "m": 0.35}),
    "arcface": ("arcface", {"s": 30.0, "m": 0.5}),
    "adacos": ("adacos", {}),
    "adaface": ("adaface", {"s": 30.0, "m": 0.4}),
}


def config(stages: int, overrides: list[str] = ()):
    return load_config(CONFIG, [f"finetune.freeze_stages={stages}", *overrides])


def cache(work: Path, stages: list[int]) -> None:
    previous = None
    for k in sorted(stages):
        build_cache(config(k), get_settings(), work / f"cache-k{k}", from_cache=previous)
        previous = work / f"cache-k{k}"


def run(work: Path, stages: int, only: list[str], overrides: list[str]) -> None:
    settings = get_settings()
    cache_dir = work / f"cache-k{stages}"
    baseline = work / "runs" / "import" / "best.json"
    if not baseline.is_file():  # the imported model, untouched, on the same held-out pairs
        baseline.parent.mkdir(parents=True, exist_ok=True)
        baseline.write_text(
            json.dumps({"step": 0, **CachedRun(config(stages, overrides), settings, cache_dir).validate()}, indent=2) + "\n"
        )
    for label, (head, params) in HEADS.items():
        if only and label not in only:
            continue
        cfg = config(stages, [f"head.name={head}", f"head.params={json.dumps(params)}", *overrides])
        out = work / "runs" / label
        print(f"== {label}: {cfg.head.name} {cfg.head.params}", flush=True)
        CachedRun(cfg, settings, cache_dir).run(out)


def _rows(work: Path) -> list[tuple[str, dict, dict]]:
    rows = []
    for best in sorted((work / "runs").glob("*/best.json")):
        label = best.parent.name
        metrics = json.loads(best.read_text())
        result_file = best.parent / "result.json"
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
        rows.append((label, metrics, result))
    return sorted(rows, key=lambda x: -x[1]["flip"]["accuracy"])


def plot(work: Path, png: Path) -> None:
    """Held-out accuracy (flip) and TAR@FAR 1e-3 per head, the import as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in _rows(work) if r[0] != "import"]
    base = json.loads((work / "runs" / "import" / "best.json").read_text())["flip"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in (
        (axes[0], lambda m: m["accuracy"], "held-out 10-fold accuracy (%)"),
        (axes[1], lambda m: m["tar_at_far"]["1e-3"], "held-out TAR @ FAR 1e-3 (%)"),
    ):
        values = [100 * key(m["flip"]) for _, m, _ in rows]
        ax.barh([label for label, _, _ in rows], values, color="tab:blue")
        ax.axvline(100 * key(base), color="black", ls="--", label="dlib-resnet-v1 (import)")
        ax.set_xlim(max(0.0, min(values + [100 * key(base)]) - 5), 100)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def table(work: Path) -> str:
    rows = _rows(work)
    lines = ["| head | held-out acc. (flip) | TAR@FAR 1e-3 | best at step | steps | train s |", "|---|---|---|---|---|---|"]
    for label, m, r in rows:
        lines.append(
            f"| {label} | {100 * m['flip']['accuracy']:.2f} ± {100 * m['flip']['accuracy_std']:.2f} | "
            f"{100 * m['flip']['tar_at_far']['1e-3']:.1f} | {m['step']} | {r.get('step', 0)} | {r.get('train_seconds', 0):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["cache", "run", "table"])
    parser.add_argument("work", type=Path)
    parser.add_argument("--stages", type=int, nargs="+", default=[5], help="finetune.freeze_stages (cache: every prefix to build)")
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--plot", type=Path, help="table: also draw the plot to this PNG")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    if args.action == "cache":
        cache(args.work, args.stages)
    elif args.action == "run":
        run(args.work, args.stages[0], args.only, args.overrides)
    else:
        print(table(args.work))
        if args.plot:
            plot(args.work, args.plot)


if __name__ == "__main__":
    main()
