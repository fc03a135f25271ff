"""Confidence limits of shares read from samples: a share of stack samples is an estimate, and
what the advisor states or decides from a few dozen of them must allow for that."""

from __future__ import annotations

import math


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
