"""Debugging modes left on in the training code: autograd's anomaly detection, a profiler.

``torch.autograd.set_detect_anomaly(True)`` (``with torch.autograd.detect_anomaly():``, Lightning's
``Trainer(detect_anomaly=True)``) makes every op of the forward record the Python stack that
created it, so a NaN in the backward can name its line, and checks every backward node's output
for NaNs. The forward's op launches then wait behind a Python stack walk each: the main thread is
seen inside ``torch.fx.traceback.format_stack`` (the stack formatter autograd calls) under the
model's own forward, and the GPU idles. A held-out Lightning GPT on an H200 ran this way (the main
thread in the formatter in ~40 % of its samples, the GPU busy 16 %) and was told launch-bound;
``detect_anomaly=False`` measured 8.3x (bench/results/real_jobs_fresh8.md).

What tells it apart: nothing else in a training step formats the Python stack op by op. torch.compile's
tracing also records stacks, under dynamo's and FX's own frames: those samples are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ...analysis import LIGHTNING
from ...model import Frame
from ..context import AnalysisContext, GpuView
from .base import MIN_COST_FRACTION, MIN_COST_S, Hit, confidence, enough_stacks, pct, significant, idle_unless_spinning, uses, worst
from .threshold import JUDGEMENT, Threshold

# The main thread inside autograd's stack formatter, under the model's forward, in at least this
# share of its samples. Anomaly mode calls it for every op, so a forward of a few dozen ops puts it
# in a large share (the held-out job ~40 %); nothing else a step does calls it at all, so the bar
# only needs to stand above a stray sample or two of sampling noise. Judgement.
ANOMALY_STACK_SHARE = Threshold(
    0.10, "share", JUDGEMENT,
    "The main thread inside autograd's per-op stack formatter (anomaly mode) at least this share of its samples: "
    "nothing else in a step formats stacks op by op (the held-out anomaly-mode job ~40 %).",
    "bench/results/real_jobs_fresh8.md")

# The formatter autograd's anomaly mode calls for each op's node (torch/csrc/autograd/python_anomaly_mode.cpp).
_FORMATTER = ("format_stack", "/torch/fx/traceback.py")
# Whose stacks are tracing's, not anomaly mode's: torch.compile records the stack of each traced op too.
_TRACING = ("/torch/_dynamo/", "/torch/_inductor/", "/torch/_functorch/", "/torch/export/")


def _path(f) -> str:
    return f.filename.replace("\\", "/")


def recording_op_stacks(frames) -> bool:
    """A sample inside autograd's per-op stack recording: ``torch.fx.traceback.format_stack``
    called from the model's code, with no compiler's tracing below it."""
    at = next((i for i, f in enumerate(frames) if f.name == _FORMATTER[0] and _path(f).endswith(_FORMATTER[1])), None)
    if at is None or at + 1 >= len(frames):
        return False
    return not any(t in _path(f) for f in frames[at + 1:] for t in _TRACING)



@dataclass(frozen=True)
class _Seen:
    """A debugging mode seen in the main thread's samples, and the GPU that idles for it."""

    share: float  # of the main thread's samples inside the mode's own code
    samples: int
    g: GpuView
    cost: float  # the GPU's idle seconds

    @property
    def idle(self) -> float:
        return self.g.breakdown.idle_s / self.g.breakdown.total_s

    @property
    def at_least(self) -> str:
        """Its gain's floor: the idle time back (the mode's own GPU work, if any, comes on top)."""
        busy = 1.0 - self.idle
        return f"at least {1.0 / busy:.1f}x" if busy > 0.0 else "large"


def _seen(ctx: AnalysisContext, inside: Callable[[Sequence[Frame]], bool], bar: float) -> _Seen | None:
    """The mode's share of the main thread's samples at or above ``bar``, with a GPU idling a
    significant share of the window; None otherwise."""
    if not enough_stacks(ctx):
        return None
    main = ctx.main_stacks
    share = sum(1 for s in main if inside(s.frames)) / len(main)
    if share < bar:
        return None
    found = worst(ctx, idle_unless_spinning, gpu_only=True)
    if found is None or not significant(found[0], found[1]):
        return None
    return _Seen(share, len(main), found[0], found[1])


@uses(ANOMALY_STACK_SHARE, MIN_COST_FRACTION, MIN_COST_S)
def check_anomaly_detection(ctx: AnalysisContext) -> Hit | None:
    m = _seen(ctx, recording_op_stacks, ANOMALY_STACK_SHARE)
    if m is None:
        return None
    g, bd = m.g, m.g.breakdown
    off = ("Trainer(detect_anomaly=False) (the default)" if ctx.framework.name == LIGHTNING else
           "remove torch.autograd.set_detect_anomaly(True) (or the `with torch.autograd.detect_anomaly():` around "
           "the step)")
    return Hit(
        evidence=(
            f"main thread inside autograd's per-op stack recording (torch.fx.traceback.format_stack under the "
            f"model's forward) in {pct(m.share)} of its samples: anomaly detection is on",
            f"{g.name} idle {pct(m.idle)} of the last {bd.total_s:.0f} s while each op waits for its stack to be "
            "formatted",
        ),
        action=(f"{off}; turn it on only to find the op that makes a NaN, then off again (it records a Python "
                "stack for every op and checks every backward output for NaNs)"),
        expected_gain=(f"{m.at_least}: the {pct(m.idle)} the GPU idles comes back, and anomaly mode's NaN checks in "
                       "the backward are GPU work of their own, so more is likely"),
        gain_bound=None,
        cost_s=m.cost,
        confidence=confidence(m.share, m.samples),
        gpu_index=g.index,
        title=f"Anomaly detection is on: every op records its Python stack ({g.name} idle {pct(m.idle)})",
    )


# The main thread inside torch.profiler's own Python (starting, stopping, exporting a trace) at
# least this share of its samples. A profiler run once (a schedule with repeat=1) is a few seconds
# at start and never again; one that cycles for ever stops, exports and restarts its trace every
# few steps (a held-out job: 69 % of its main thread's samples; without it 4.68x). Judgement: the
# same bar as anomaly mode's, above a stray sample or two.
PROFILER_SHARE = Threshold(
    0.10, "share", JUDGEMENT,
    "The main thread inside torch.profiler's start/stop/export at least this share of its samples: a profiler "
    "left cycling in the loop (the held-out job 69 %).", "bench/results/real_jobs_fresh9.md")
_PROFILER_DIRS = ("/torch/profiler/", "/torch/autograd/profiler.py", "/torch/autograd/profiler_util.py")


def in_profiler(frames) -> bool:
    """A sample inside torch.profiler's own Python: its step, trace start/stop, export."""
    return any(d in _path(f) for f in frames for d in _PROFILER_DIRS)


@uses(PROFILER_SHARE, MIN_COST_FRACTION, MIN_COST_S)
def check_profiler_in_loop(ctx: AnalysisContext) -> Hit | None:
    m = _seen(ctx, in_profiler, PROFILER_SHARE)
    if m is None:
        return None
    g, bd = m.g, m.g.breakdown
    return Hit(
        evidence=(
            f"main thread inside torch.profiler (its step, trace start/stop and export) in {pct(m.share)} of its "
            "samples: a profiler runs in the training loop",
            f"{g.name} idle {pct(m.idle)} of the last {bd.total_s:.0f} s",
        ),
        action=("profile a few steps, then stop: torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1) "
                "(without repeat the cycle runs for ever, exporting a trace each time), or take the "
                "torch.profiler.profile(...) context off the training loop once the trace is taken"),
        expected_gain=(f"{m.at_least}: the {pct(m.idle)} the GPU idles comes back, and the recording's own overhead on "
                       "every op (shapes, stacks, memory) goes with it"),
        gain_bound=None,
        cost_s=m.cost,
        confidence=confidence(m.share, m.samples),
        gpu_index=g.index,
        title=f"A profiler runs in the training loop ({g.name} idle {pct(m.idle)})",
    )

