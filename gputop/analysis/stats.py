"""Confidence limits of shares read from samples: a share of stack samples is an estimate, and
what the advisor states or decides from a few dozen of them must allow for that."""

from __future__ import annotations

import math
from functools import lru_cache

from .threshold import JUDGEMENT, IntThreshold


def wilson_interval(k: float, n: int, z: float) -> tuple[float, float]:
    """Wilson's score interval of a share seen in ``k`` of ``n`` samples at the normal quantile
    ``z`` (0: the share itself; no samples: (0, 1))."""
    if n <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, k / n))
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, min(p, (centre - half) / (1 + z2 / n))), min(1.0, max(p, (centre + half) / (1 + z2 / n)))


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed over the shorter tail in logs (k near n is the
    common case: a share near 1)."""
    if k >= n:
        return 1.0
    if k < 0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)

    def term(i: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)

    if k < n - k:
        return min(1.0, sum(term(i) for i in range(k + 1)))
    return max(0.0, 1.0 - sum(term(i) for i in range(k + 1, n + 1)))


# The exact limit is summed where a tail holds at most this many samples; past it, on both
# sides, Wilson's. Judgement: with hundreds of samples inside and outside a share, Wilson's
# one-sided coverage is within a point of its level; its misses are near a share of 0 or 1 with few
# samples on one side, which the exact sum keeps.
EXACT_MAX_TAIL = IntThreshold(
    500, "samples", JUDGEMENT,
    "The exact (Clopper-Pearson) limit is summed while either side of a share holds at most this many samples; past "
    "it on both sides, Wilson's limit (the normal regime, where it covers at its level) at a fraction of the cost.")


@lru_cache(maxsize=4096)
def exact_upper(k: int, n: int, z: float) -> float:
    """Clopper-Pearson's (exact) upper confidence limit of a share seen in ``k`` of ``n`` samples,
    one-sided at the level the normal quantile ``z`` stands for: the largest p under which seeing
    ``k`` or fewer is still at least that level's tail (P(X <= k; n, p) = 1 - Phi(z)). Unlike
    Wilson's it covers the true share at least at its level for every p and n: near a share of 1
    Wilson's one-sided 95 % limit covers it in as few as 82 % of draws (p 0.99 from 20 samples:
    19 of 20 gives 0.989, under the truth), and there 1 / (1 - p) is steepest. 1 without samples
    or with every sample in it."""
    if n <= 0 or k >= n:
        return 1.0
    k = max(0, k)
    if min(k, n - k) > EXACT_MAX_TAIL:
        # Both counts large: the normal regime, where Wilson's limit covers at its level; the exact
        # sum would cost a term per sample per bisection step (a share of 0.5 from 10^6 samples
        # took seconds).
        return wilson_interval(k, n, z)[1]
    alpha = 0.5 * math.erfc(z / math.sqrt(2))
    lo, hi = k / n, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if _binomial_cdf(k, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi
