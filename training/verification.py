"""Face-verification metrics from pair scores: 10-fold accuracy (threshold chosen on the other
folds), AUC, EER, TAR at fixed FARs, and the ROC curve as a PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from service.core.models.manifest import far_key

# The false-accept rates the project calibrates thresholds for and reports TAR at.
FARS = (1e-2, 1e-3, 1e-4, 1e-5)


def best_threshold(scores: np.ndarray, issame: np.ndarray) -> float:
    """The threshold maximizing accuracy (score ≥ t ⇒ same); midpoints between sorted scores are the
    only places accuracy can change, so they are the exact candidate set."""
    s = np.sort(scores)
    candidates = np.concatenate([[s[0] - 1e-6], (s[1:] + s[:-1]) / 2, [s[-1] + 1e-6]])
    correct = ((scores[None, :] >= candidates[:, None]) == issame[None, :]).sum(axis=1)
    return float(candidates[int(np.argmax(correct))])


def kfold_accuracy(scores: np.ndarray, issame: np.ndarray, folds: np.ndarray) -> tuple[float, float, list[float]]:
    """Mean, std of per-fold accuracy; each fold's threshold is fit on the other folds."""
    accuracies, thresholds = [], []
    for fold in np.unique(folds):
        test = folds == fold
        t = best_threshold(scores[~test], issame[~test])
        thresholds.append(t)
        accuracies.append(float(((scores[test] >= t) == issame[test]).mean()))
    return float(np.mean(accuracies)), float(np.std(accuracies)), thresholds


def verification_metrics(scores: np.ndarray, issame: np.ndarray, folds: np.ndarray) -> dict:
    scores, issame = np.asarray(scores, np.float64), np.asarray(issame, bool)
    mean, std, thresholds = kfold_accuracy(scores, issame, np.asarray(folds))
    fpr, tpr, _ = roc_curve(issame, scores)
    fnr = 1 - tpr
    i = int(np.nanargmin(np.abs(fnr - fpr)))
    return {
        "pairs": int(len(scores)),
        "accuracy": mean,
        "accuracy_std": std,
        "threshold": float(np.mean(thresholds)),
        "auc": float(roc_auc_score(issame, scores)),
        "eer": float((fpr[i] + fnr[i]) / 2),
        # the best TAR whose FAR does not exceed the target (no interpolation past the data)
        "tar_at_far": {far_key(f): float(tpr[fpr <= f].max()) for f in FARS},
    }


def at_thresholds(scores: np.ndarray, issame: np.ndarray, thresholds: dict[str, float]) -> dict:
    """What a model's calibrated thresholds (FAR → cosine) realize on these pairs: the FAR and TAR
    measured here, with the counts behind them (a FAR below 1/impostors cannot be resolved)."""
    scores, issame = np.asarray(scores, np.float64), np.asarray(issame, bool)
    impostor, genuine = scores[~issame], scores[issame]
    out = {}
    for key, t in sorted(thresholds.items(), key=lambda kv: float(kv[0]), reverse=True):
        accepted = int((impostor >= t).sum())
        out[key] = {
            "threshold": t,
            "far": accepted / len(impostor),
            "false_accepts": accepted,
            "impostor_pairs": int(len(impostor)),
            "tar": float((genuine >= t).mean()),
        }
    return out


def plot_roc(curves: dict[str, tuple[np.ndarray, np.ndarray]], path: Path) -> None:
    """curves: label → (scores, issame). Log-scale FAR, as face verification is read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4), dpi=120)
    for label, (scores, issame) in curves.items():
        fpr, tpr, _ = roc_curve(issame, scores)
        ax.plot(np.maximum(fpr, 1e-5), tpr, label=label)
    ax.set_xscale("log")
    ax.set_xlim(1e-4, 1)
    ax.set_xlabel("FAR (false accept rate)")
    ax.set_ylabel("TAR (true accept rate)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
