"""The similarity foreign clients compare against their own thresholds.

CompreFace and DeepStack clients hold a score to a fixed cut (Viseron's 0.5, Double Take's 60 %).
A raw cosine of dlib-resnet-v1 puts strangers near 0.84, so those cuts would match everyone. The
calibrated similarity is instead a log scale of the rate at which a stranger scores this high:

    similarity = clamp(log10(rate) / (2 · log10(anchor)), 0, 1)

where `rate` is how often a stranger scores this high: for a pair the calibrated FAR of its cosine
(`Manifest.far_at`), for a gallery search the FPIR of the score its FPIR decision holds
(`Decision.rate`: the margin score's, read off the open-set table and the gallery's guard, or a
cosine's or AS-norm score's FAR over the N faces searched, 1 − (1 − FAR)^N); and `anchor` is
facegate's own default (FACEGATE_DEFAULT_FPIR for a search, FACEGATE_DEFAULT_FAR for a pair). So
0.5 is exactly facegate's default decision, 0.6 a stranger rate 10^(0.2·log10 anchor) times lower
(1e-2 → 4e-3), 1.0 the anchor squared (1e-4).
"""

from __future__ import annotations

import math


def calibrated_similarity(rate: float, anchor: float) -> float:
    """The 0…1 similarity of a stranger rate (a pair's FAR, a search's FPIR) that is 0.5 at `anchor`."""
    if rate <= 0.0:
        return 1.0
    return round(min(1.0, max(0.0, math.log10(rate) / (2 * math.log10(anchor)))), 5)
