"""Convolutions whose algorithm cuDNN keeps choosing: benchmark mode re-tunes each new input shape.

With ``torch.backends.cudnn.benchmark = True`` (Lightning's ``Trainer(benchmark=True)``) the first
convolution of every new input shape times each of cuDNN's algorithms before it runs. With inputs
of a fixed size that is once, at warm-up; with lengths that vary batch to batch (audio clips, text
without buckets) it is every step: the main thread sits inside the convolution call on the CPU
while the GPU runs the trial kernels and idles between them. A held-out Lightning audio job on an
H200 did this (its main thread inside ``Conv1d._conv_forward`` in 42 % of its samples, the GPU
idle 54 %) and was told launch-bound; ``Trainer(benchmark=False)`` measured 6.76x, padding the
clips to a multiple of a second 6.26x (bench/results/real_jobs_fresh6.md).

What tells it from launch overhead: a convolution launch returns in microseconds, so a main thread
sampled inside the call this often is doing work in it, and the kernels that do run fill the SMs
(trial runs of full-size convolutions), where a launch-bound conv net's kernels are small.
"""

from __future__ import annotations

from ...analysis import CPU_DEVICE, LIGHTNING, short_path
from ...model import Category
from ..context import AnalysisContext, GpuView
from .base import (
    GPM_BUSY_UTIL_PCT, MIN_COST_FRACTION, MIN_COST_S, Hit, confidence, enough_stacks, pct, significant, spinning,
    training_share, uses, worst,
)
from .threshold import JUDGEMENT, Threshold

# The main thread on the CPU inside a convolution call in at least this share of its samples.
# Measured: the re-tuning job 42 %; healthy conv nets 5-11 % (a bf16 ResNet-50, a ConvNeXt, a
# ViT's conv stem); judgement between them.
CONV_CALL_SHARE = Threshold(
    0.25, "share", JUDGEMENT,
    "The main thread on the CPU inside convolution calls at least this share of its samples: the call does "
    "work of its own (cuDNN's algorithm search), not a microsecond launch (re-tuning job 42 %, healthy conv nets "
    "5-11 %).", "bench/results/real_jobs_fresh6.md")
# The kernels that run fill the SMs at least this much per point of utilisation: full-size
# convolutions (the search's trials), not the small kernels of a launch-bound conv net. A model's
# kernels fill 0.6-1.0, a loop of tiny ops 0.006 (measured on an H100); the re-tuning job 0.94.
CONV_TRIAL_FILL = Threshold(
    0.6, "SM % per util %", JUDGEMENT,
    "The GPU's kernels fill the SMs at least this much per point of utilisation: full-size convolutions (the "
    "search's trials), not a launch-bound conv net's small kernels (a model's 0.6-1.0, tiny ops 0.006).")

_CONV_CALLS = ("_conv_forward", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
               "conv_transpose3d")


def _in_conv_call(frames) -> bool:
    """The newest Python frame is a convolution's call into torch (``Conv2d._conv_forward``,
    ``F.conv2d`` wrapped): the thread is inside the C++ call, not dispatching Python."""
    return bool(frames) and frames[0].name.rsplit(".", 1)[-1] in _CONV_CALLS


@uses(CONV_CALL_SHARE, CONV_TRIAL_FILL, GPM_BUSY_UTIL_PCT, MIN_COST_FRACTION, MIN_COST_S)
def check_cudnn_retune(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx):
        return None
    main = ctx.main_stacks
    inside = sum(1 for s in main if s.active and s.category is Category.FORWARD and _in_conv_call(s.frames))
    share = inside / len(main)
    if share < CONV_CALL_SHARE:
        return None

    def cost(g: GpuView) -> float:
        e = g.efficiency
        if spinning(g) or e.sm_fill is None or e.sm_fill < CONV_TRIAL_FILL:
            return 0.0
        if e.util_busy_mean is None or e.util_busy_mean < GPM_BUSY_UTIL_PCT:
            return 0.0
        return g.breakdown.idle_s

    found = worst(ctx, cost, gpu_only=True)
    if found is None or not significant(found[0], found[1]):
        return None
    g, c = found
    e, bd = g.efficiency, g.breakdown
    model = training_share(ctx, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER)
    lightning = ctx.framework.name == LIGHTNING
    off = "Trainer(benchmark=False) (or torch.backends.cudnn.benchmark = False)" if lightning else \
        "torch.backends.cudnn.benchmark = False"
    return Hit(
        evidence=(
            f"main thread on the CPU inside convolution calls in {pct(share)} of its samples "
            f"(forward/backward/optimizer {pct(model)}): a convolution's launch takes microseconds, so the "
            "time goes to cuDNN choosing its algorithm",
            f"{g.name} idle {pct(bd.idle_s / bd.total_s)} of the last {bd.total_s:.0f} s while its kernels fill "
            f"the SMs ({e.sm_fill:.2f} of utilisation): full-size trial convolutions, not small launch-bound kernels",
        ),
        action=(f"if cuDNN benchmark mode is on, every new input shape runs its algorithm search again: pad or "
                f"bucket the inputs to a few fixed shapes (lengths to a multiple, images to a few sizes), or {off}"),
        expected_gain=(f"the {pct(bd.idle_s / bd.total_s)} the GPU idles comes back, and more: the search's trial "
                       "kernels count as busy time too, so no upper bound is stated"),
        gain_bound=None,
        cost_s=c,
        # Below the sampling's own confidence: the stacks cannot show that benchmark mode is on, only
        # that the CPU time is inside the calls.
        confidence=confidence(share, len(main)) * 0.8,
        gpu_index=g.index,
        title=f"cuDNN re-tunes convolutions: {g.name} idle {pct(bd.idle_s / bd.total_s)} while the main thread "
              f"waits inside conv calls",
    )


# --------------------------------------------------------------------------- cuDNN turned off


def cudnn_off_at(ctx: AnalysisContext) -> str | None:
    """"file:line" of the line in a file of the main thread's stacks that turns cuDNN off
    (Frame.cudnn_off, read from the source), or None."""
    for s in reversed(ctx.main_stacks):
        for f in s.frames:
            if f.cudnn_off:
                return f"{short_path(f.filename)}:{f.cudnn_off}"
    return None


@uses(CONV_CALL_SHARE)
def check_cudnn_disabled(ctx: AnalysisContext) -> Hit | None:
    """cuDNN turned off in the job's code (``torch.backends.cudnn.enabled = False``, often in a
    seeding helper "for reproducibility") while the convolutions take the main thread's time: the
    line alone may sit under a flag that did not run, so the stacks must show what it does. With
    cuDNN off PyTorch convolves by its native fallback (im2col and a matrix product, image by image,
    many small launches from the CPU): the main thread sits inside the convolution calls, where a
    launch into cuDNN returns in microseconds (healthy conv nets 5-11 % of the samples). A held-out
    timm ResNet-50 under bf16 with cuDNN off sat there in 30 % of its samples, tensor cores ~2 %
    active; keeping cuDNN on measured 11.1x (H200, bench/results/real_jobs_fresh10.md)."""
    gpus = [g for g in ctx.gpus if g.index != CPU_DEVICE]
    if not gpus or not enough_stacks(ctx):
        return None  # on the CPU cuDNN is not used, and a conv net's thread computes inside the calls
    where = cudnn_off_at(ctx)
    if where is None:
        return None
    main = ctx.main_stacks
    inside = sum(1 for s in main if s.active and s.category in (Category.FORWARD, Category.BACKWARD)
                 and _in_conv_call(s.frames))
    share = inside / len(main)
    if share < CONV_CALL_SHARE:
        return None
    g = max(gpus, key=lambda v: v.breakdown.total_s)
    return Hit(
        evidence=(
            f"`torch.backends.cudnn.enabled = False` at {where}: every convolution runs PyTorch's native "
            "fallback (im2col and a matrix product, image by image), not cuDNN",
            f"main thread on the CPU inside convolution calls in {pct(share)} of its samples: a launch into "
            "cuDNN returns in microseconds (healthy conv nets 5-11 %), the fallback issues its many small "
            "launches from there",
        ) + ((f"{g.name}: tensor cores active {g.efficiency.tensor_active:.0f} %, SMs {g.efficiency.sm_active:.0f} %",)
             if g is not None and g.efficiency.tensor_active is not None and g.efficiency.sm_active is not None else ()),
        action=(f"remove `torch.backends.cudnn.enabled = False` ({where}); for runs that repeat bit for bit keep "
                "cuDNN on with torch.backends.cudnn.deterministic = True and benchmark = False (or "
                "torch.use_deterministic_algorithms(True)), which cost far less than turning it off"),
        expected_gain=(f"at least {1 / (1 - min(share, 0.95)):.1f}x steps/s (the time inside convolution calls on the "
                       "CPU goes), and usually far more: the fallback's kernels are slow too (a ResNet-50 under bf16: "
                       "11.1x with cuDNN on)"),
        gain_bound=None,
        cost_s=share * (ctx.t1 - ctx.t0),
        confidence=confidence(share, len(main)),
        gpu_index=g.index if g is not None else None,
        title=f"cuDNN is turned off ({where}): convolutions run PyTorch's slow fallback",
    )
