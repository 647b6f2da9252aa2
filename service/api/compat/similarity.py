"""The similarity foreign clients compare against their own thresholds.

CompreFace and DeepStack clients hold a score to a fixed cut (Viseron's 0.5, Double Take's 60 %).
A raw cosine of dlib-resnet-v1 puts strangers near 0.84, so those cuts would match everyone. The
calibrated similarity is instead a log scale of the rate at which a stranger scores this high:

    similarity = clamp(log10(rate) / (2 · log10(anchor)), 0, 1)

where `rate` is the calibrated per-comparison FAR of the score (`Manifest.far_at` of a cosine, or
`service.core.decision.search_far`, which scores a search as its FPIR decision does), turned into a
false-positive identification rate over the N faces searched for a gallery search
(1 − (1 − FAR)^N), and `anchor` is facegate's own default (FACEGATE_DEFAULT_FPIR for a search,
FACEGATE_DEFAULT_FAR for a pair). So 0.5 is exactly facegate's default decision, 0.6 a stranger
rate 10^(0.2·log10 anchor) times lower (1e-2 → 4e-3), 1.0 the anchor squared (1e-4).
"""

from __future__ import annotations

import math


def calibrated_similarity(far: float, anchor: float, searched: int = 1) -> float:
    """The 0…1 similarity of a per-comparison FAR whose stranger rate over `searched` comparisons is `anchor` at 0.5."""
    rate = -math.expm1(max(searched, 1) * math.log1p(-min(far, 1 - 1e-12)))  # 1 − (1 − far)^N
    if rate <= 0.0:
        return 1.0
    return round(min(1.0, max(0.0, math.log10(rate) / (2 * math.log10(anchor)))), 5)
