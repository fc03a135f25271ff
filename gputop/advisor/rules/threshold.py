"""The rules' thresholds are the analysis' type (``gputop.analysis.threshold``): one type for
every decision bar of the house, so ``gputop rules`` shows the analysis' bars beside the rules'.
The rules' modules import it from here, beside them."""

from __future__ import annotations

from ...analysis import (
    DERIVED, DOCUMENTED, JUDGEMENT, MEASURED, AnyThreshold, Basis, IntThreshold, Threshold, is_threshold,
)

__all__ = [
    "DERIVED", "DOCUMENTED", "JUDGEMENT", "MEASURED", "AnyThreshold", "Basis", "IntThreshold", "Threshold",
    "is_threshold",
]
