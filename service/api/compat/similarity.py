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

Below a search's decision (a candidate that is not a match, where Double Take shows a name from 0.4)
the rate is the higher of the decision's and the candidate's cosine's over every face searched,
1 − (1 − FAR)^N, the rule before the margin score (`search_similarity`): its best face's cosine, also
where the decision is on its faces' mean (a mean's cosine is not a pair's, whose FAR the curve gives;
on LFW's galleries of 3–10 photos per subject the best face's floor names fewer strangers at 0.4
than before the mean, the mean's more, docs/compat.md). The open-set table's rates
are close to what LFW's strangers realize; the cosine's over several faces are pessimistic (a
subject's faces are not independent tries), so the higher of the two shows a name below the match
only where both say strangers rarely get it: on LFW's galleries of 1–9 subjects the table's rate
alone named 1.2–1.6 times as many strangers at 0.4 as before the margin score, the higher of the
two exactly as many (docs/compat.md). A candidate a decision on the mean's rows scored on its best
face (`Decision.on_mean_scale`: the rarer of its best face's and its mean's rates) is held below the
decision to its mean's rate too, the higher of all, as before that rule. At and above the decision,
where a client matches, the decision's rate alone: it finds more genuine faces at 0.6 than the
cosine did.
"""

from __future__ import annotations

import math

from service.core.decision import Candidate, Decision, search_rate
from service.core.models.manifest import Manifest


def calibrated_similarity(rate: float, anchor: float) -> float:
    """The 0…1 similarity of a stranger rate (a pair's FAR, a search's FPIR) that is 0.5 at `anchor`."""
    if rate <= 0.0:
        return 1.0
    return round(min(1.0, max(0.0, math.log10(rate) / (2 * math.log10(anchor)))), 5)


def search_similarity(decision: Decision, manifest: Manifest, score: float, candidate: Candidate, anchor: float) -> float:
    """A search candidate's similarity: the rate of the `score` its decision holds it to, below the
    decision's threshold no lower than its best face's cosine's over the faces searched, nor than its
    mean's where the decision scored it on its best face (see above)."""
    rate = decision.rate(score)
    if decision.margin is not None and score < decision.threshold:
        if candidate.mean is not None:
            rate = max(rate, decision.rate(candidate.mean))
        try:
            rate = max(rate, search_rate(manifest.far_at(candidate.face_similarity), decision.gallery_faces or 1))
        except KeyError:  # no calibrated FAR curve: the table's rate alone
            pass
    return calibrated_similarity(rate, anchor)
