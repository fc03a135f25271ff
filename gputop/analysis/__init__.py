"""Analysis: pure functions over a window of the store (idle intervals, the time breakdown,
efficiency, the step, progress, the stuck verdict, ranks, NCCL's RAS reports). This is its
face: the layers above import from here, never from its modules (an import-linter contract
keeps it so), so a module can be split or renamed without touching them."""

from __future__ import annotations

import sys

# The classifier as a function: ``classify`` alone would name the module gputop.analysis.classify.
from .gil_holder import GIL_HELD_SHARE, GIL_MIN_SAMPLES, GilHolder, gil_holder_of
from .made_on_cpu import BuiltOnCpu, built_on_cpu
from .backward_calls import BackwardRepeats, backward_repeats
from .forward_comm import ForwardComm, RankForwardComm, forward_comm_of
from .classify import classify as classify_stack

from .breakdown import (
    BUCKET_LABELS, Breakdown, Bucket, CPU_DEVICE, POLL_JOIN_S, STACK_JOIN_S, attribute, bucket_of,
    stack_label, stack_slices, whole_percentages,
)
from .classify import (
    hot_place, importing_at, is_library, own_frames, project_frame, short_path, where,
)
from .efficiency import (
    WORKER_LOOP_FRAME, GpuEfficiency, HostLoad, ProcStats, Workers, descends_from, gpu_efficiency, host_load, is_worker,
    parents_of, proc_stats, worker_stats,
)
from .loader_fetch import PerRowFetch, per_row_fetch
from .flight_recorder import (
    Autopsy, analyzer_view, autopsy, autopsy_dict, autopsy_hint, autopsy_text, dump_prefix, dump_problem,
    rebuild_pg_config,
)
from .frameworks import (
    ACCELERATE, FP32, FrameworkSeen, HALF, HF_TRAINER, LIGHTNING, MIXED, framework_of, loader_knob, precision_knob,
)
from .hang import COLLECTIVE, UNKNOWN as UNKNOWN_HANG, collective_fn
from .idle import (
    IDLE_UTIL_PCT, MAX_POLL_SLICE_S, MAX_SLICE_S, NOMINAL_PERIOD_S, Slice, idle_intervals, periodicity,
    poll_slices, util_slices, median_util_at)
from .memory_cause import LeakLine, exit_cause, exit_status_of, leak_line, leak_lines
from .memory_growth import FLAT, GROWING, MIN_POINTS, MIN_SPAN_S, PLATEAU, SAWTOOTH, Growth, eta_text, growth, rate_text, theil_sen
from .memory_window import (
    COPY_ON_READ, MAIN_LEAK, MEMORY_WINDOW_S, PRIVATE_GONE_S, GpuMemory, MemoryView, WorkerMemory, WorkersPrivate, jobs_private,
    median_rate, memory_view,
)
from .nccl_ras import CommVerdict, DESYNC, HANG, RAS_POLL_S, STRAGGLER, STRAGGLER_MIN_GAP_OPS, ras_line, ras_verdicts
from .progress import CPU_WINDOW_S, TREE_BUSY_CORES
from .hang_forming import Forming, hang_forming
from .step_order import AFTER_UPDATE, BEFORE_FORWARD, when_in_step
from .ranks import (
    GROUPS, JobView, RANKS_SOURCE, RankView, Straggler, as_ranks, doing_now, group_shares, hot_line, rank_map,
    rank_views, ranks_message, straggler,
)
from .recompute import (
    CKPT_COMPOSABLE, CKPT_DEEPSPEED, CKPT_HF, CKPT_MEGATRON, CKPT_PLAIN, CKPT_WRAPPER, ProcRecompute, Recompute,
    recompute_of,
)
from .spin import spin_share
from .stacks_summary import Hot, StacksView, WorkerView
from .stats import exact_upper, wilson_interval
from .step import EVAL, Evaluation, StepModel, compiling, step_dict, step_line, step_model
from .stuck import (
    DEFAULT_STUCK_AFTER_S, GPU_IDLE_PCT, GPU_IDLE_WINDOW_S, LOOKBACK_EXTRA_S, StuckVerdict, across_ranks,
    family_tasks, idle_reach, judge, latest_others, spinning_pids,
)
from .threshold import (
    DERIVED, DOCUMENTED, JUDGEMENT, MEASURED, AnyThreshold, Basis, IntThreshold, Threshold, is_threshold,
)
from .throttle import (
    POWER_MASK, REASONS, THERMAL_MASK, decode_throttle, is_performance_limiting, throttle_label,
)
from .views import ViewsStage, pane_views, views_of
from .watch import StuckWatch
from .window import (
    DEFAULT_WINDOW_S, GpuView, JobWindow, LinkTraffic, holds_no_gpu, job_view, read_window, stacks_view, stuck_verdict,
)

# Every decision bar of the analysis, module by module, each in the order its module defines them:
# what ``gputop rules`` lists under the analysis. Found rather than listed by hand, so a new
# threshold cannot be left out (tests/test_thresholds.py holds every numeric constant to it).
ANALYSIS_THRESHOLDS: tuple[AnyThreshold, ...] = tuple(
    v for name, mod in sorted(sys.modules.copy().items()) if name.startswith(__name__ + ".")
    for v in vars(mod).values() if is_threshold(v) and v.module == name
)

__all__ = [
    "Forming", "hang_forming",
    "AFTER_UPDATE", "BEFORE_FORWARD", "when_in_step",
    "classify_stack",
    "ANALYSIS_THRESHOLDS",
    "DERIVED", "DOCUMENTED", "JUDGEMENT", "MEASURED", "AnyThreshold", "Basis", "IntThreshold", "Threshold",
    "is_threshold",
    "Autopsy", "analyzer_view", "autopsy", "autopsy_dict", "autopsy_hint", "autopsy_text", "dump_prefix",
    "dump_problem", "rebuild_pg_config",
    "BUCKET_LABELS", "Breakdown", "Bucket", "COLLECTIVE", "CPU_DEVICE", "CPU_WINDOW_S", "CommVerdict",
    "DEFAULT_STUCK_AFTER_S", "DEFAULT_WINDOW_S", "DESYNC", "EVAL", "Evaluation", "FP32", "FrameworkSeen", "GPU_IDLE_PCT", "GPU_IDLE_WINDOW_S",
    "GROUPS", "GpuEfficiency", "GpuView", "HALF", "HANG", "UNKNOWN_HANG", "RAS_POLL_S", "HF_TRAINER", "HostLoad", "Hot", "IDLE_UTIL_PCT",
    "JobView", "JobWindow", "LinkTraffic", "LIGHTNING", "LOOKBACK_EXTRA_S", "MAX_POLL_SLICE_S", "MAX_SLICE_S", "MIXED",
    "NOMINAL_PERIOD_S", "POLL_JOIN_S", "POWER_MASK", "ProcStats", "RANKS_SOURCE", "REASONS", "RankView",
    "STACK_JOIN_S", "STRAGGLER", "STRAGGLER_MIN_GAP_OPS", "Slice", "Straggler", "StacksView", "StepModel", "StuckVerdict", "StuckWatch",
    "THERMAL_MASK", "TREE_BUSY_CORES", "ViewsStage", "WorkerView", "Workers", "across_ranks",
    "as_ranks", "attribute", "bucket_of", "collective_fn", "compiling", "decode_throttle",
    "doing_now", "family_tasks", "framework_of", "gpu_efficiency", "group_shares", "holds_no_gpu", "host_load",
    "hot_line", "hot_place", "idle_intervals", "idle_reach", "importing_at", "is_library",
    "is_performance_limiting", "is_worker", "WORKER_LOOP_FRAME", "descends_from", "parents_of", "job_view", "judge", "latest_others", "loader_knob", "own_frames",
    "pane_views", "periodicity", "poll_slices", "precision_knob", "proc_stats", "project_frame", "rank_map",
    "rank_views", "ranks_message", "ras_line", "ras_verdicts", "read_window", "short_path", "spin_share",
    "spinning_pids", "stack_label", "stack_slices", "stacks_view", "step_dict", "step_line",
    "step_model", "straggler", "stuck_verdict", "throttle_label", "util_slices", "views_of", "where", "whole_percentages",
    "exact_upper", "wilson_interval", "worker_stats",
    "COPY_ON_READ", "FLAT", "GROWING", "MIN_POINTS", "MIN_SPAN_S", "PLATEAU", "SAWTOOTH", "GpuMemory", "Growth", "LeakLine", "MAIN_LEAK", "MEMORY_WINDOW_S", "MemoryView",
    "PRIVATE_GONE_S", "WorkerMemory", "WorkersPrivate", "eta_text", "jobs_private", "median_rate",
    "exit_cause", "exit_status_of", "growth", "leak_line", "leak_lines", "memory_view", "rate_text", "theil_sen",
    "CKPT_COMPOSABLE", "CKPT_DEEPSPEED", "CKPT_HF", "CKPT_MEGATRON", "CKPT_PLAIN", "CKPT_WRAPPER", "ProcRecompute",
    "Recompute", "recompute_of", "ACCELERATE", "BuiltOnCpu", "built_on_cpu", "median_util_at", "GIL_HELD_SHARE", "GIL_MIN_SAMPLES", "GilHolder", "gil_holder_of", "BackwardRepeats", "backward_repeats", "ForwardComm", "RankForwardComm", "forward_comm_of",
]
