"""The advisor: findings from the analysis, with evidence, the exact change and the gain to expect. This is its face: the layers above import from here (an import-linter contract keeps it so)."""

from __future__ import annotations

from .context import DEFAULT_WINDOW_S, holds_no_gpu
from .engine import RECORD_REFRESH_S, STATE_IDS, WARMUP_ID, WEIGHING_ID, Advisor, AdvisorSource, nothing_yet
from .fingerprint import advisor_fingerprint
from .rules import RULES, RULES_BY_ID, Rule
from .rules.base import MIN_COST_FRACTION, MIN_MAIN_SAMPLES, STATEMENT_THRESHOLDS
from .rules.base import times as gain_times
from .memory_watch import MemoryWatch
from .rules.distributed import GPU_OTHERS_WAIT_MIN, GPU_STRAGGLER_GAP, OTHERS_WAIT_MIN, STRAGGLER_GAP, STRAGGLER_LEVEL
from .rules.memory import WARN_WITHIN_S as MEMORY_WARN_WITHIN_S
from .rules.threshold import AnyThreshold, Basis, IntThreshold, Threshold
from .stage import JobStage, add_job_stage

__all__ = [
    "DEFAULT_WINDOW_S", "GPU_OTHERS_WAIT_MIN", "GPU_STRAGGLER_GAP", "MEMORY_WARN_WITHIN_S", "MIN_MAIN_SAMPLES", "OTHERS_WAIT_MIN", "RECORD_REFRESH_S", "STRAGGLER_GAP", "WARMUP_ID", "STATE_IDS", "WEIGHING_ID",
    "STRAGGLER_LEVEL", "Advisor", "AdvisorSource", "advisor_fingerprint", "JobStage", "MemoryWatch", "add_job_stage", "holds_no_gpu", "nothing_yet",
    "RULES", "RULES_BY_ID", "STATEMENT_THRESHOLDS", "AnyThreshold", "Basis", "IntThreshold", "Rule", "Threshold",
    "MIN_COST_FRACTION", "gain_times",
]
