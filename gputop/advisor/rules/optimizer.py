"""The optimizer step: a loop over parameter tensors where one fused kernel would do.

PyTorch's Adam, AdamW, SGD and friends have three implementations, and the stack names the one
that runs: ``_single_tensor_adam`` (a Python loop, several kernels per parameter tensor:
``foreach=False``, or the default where foreach cannot be used), ``_multi_tensor_adam`` (the
default on CUDA: kernels over lists of tensors) and ``_fused_adam`` (one kernel for all of them,
``fused=True``). The first two are Python that launches kernels: on a job whose GPU waits for
the CPU to launch work, their time is GPU idle time, and ``fused=True`` takes most of it away.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ...analysis import Bucket, median_util_at
from ...analysis import HF_TRAINER, LIGHTNING, short_path
from ...model import Category, StackSample
from ..context import AnalysisContext, GpuView
from .base import (
    GPM_BUSY_UTIL_PCT, LAUNCH_BOUND_SM_ACTIVE_PCT, MIN_COST_FRACTION, MIN_COST_S, MIN_MAIN_SAMPLES, MIN_RECURRENCES,
    Hit, bounded, confidence, enough_stacks, gain, idle_line, pct, sampled_upper, significant, starved_sm_s, uses,
    worst,
)
from .threshold import JUDGEMENT, IntThreshold, Threshold

_UNFUSED = re.compile(r"^_(single|multi)_tensor_(\w+)$")
_OPTIM_DIR = "torch/optim/"
UNFUSED_MIN_SHARE = Threshold(
    0.15, "share", JUDGEMENT,
    "The unfused step in this share of the main thread's samples: the bar a cause must clear "
    "(MIN_COST_FRACTION) plus room for the part the fused step keeps.")
# The optimizer is the dispatch's largest part at this share of the samples launching work: the
# change to name is the optimizer's, not the model's (launch-bound defers to this finding unless
# a larger batch fits, which amortises the step too).
OPTIMIZER_LEADS_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "The optimizer step is at least half of what the main thread launches: the change is the optimizer's, "
    "not the model's.")
# Optimizers with a fused implementation in torch.optim (torch >= 2.4 for SGD and Adagrad;
# older releases give AdamW its own _single_tensor_adamw).
FUSED_OK = {"adam", "adamw", "sgd", "adagrad"}
# What to write: AdamW runs Adam's implementation (its stack says _single_tensor_adam), and both
# take the flag.
_CLASS = {"adam": "AdamW", "adamw": "AdamW", "sgd": "SGD", "adagrad": "Adagrad"}


@dataclass(frozen=True)
class UnfusedStep:
    share: float  # of the main thread's samples
    optimizer: str  # "adam", "sgd", ...
    loop: bool  # the per-tensor Python loop (foreach=False), not the foreach lists
    samples: int
    # An optimizer of a library's or the user's own (a torch.optim.Optimizer subclass outside
    # torch.optim, such as transformers' Adafactor): its class and where its step is; None for
    # torch.optim's own.
    own: tuple[str, str] | None = None


def _own_step(frames) -> tuple[str, str] | None:
    """(class, file:line) of an Optimizer subclass's ``step`` written outside torch.optim, called
    through torch.optim's step wrapper (every Optimizer subclass's step is): its Python is the
    step's per-tensor loop."""
    for i, f in enumerate(frames):
        if not f.name.endswith(".step") or _OPTIM_DIR in f.filename.replace("\\", "/"):
            continue
        if any(_OPTIM_DIR in g.filename.replace("\\", "/") and "profile_hook_step" in g.name for g in frames[i + 1:i + 4]):
            return f.name.rsplit(".", 1)[0], f"{short_path(f.filename)}:{f.line}"
        return None
    return None


def unfused_step(ctx: AnalysisContext) -> UnfusedStep | None:
    """The main thread's time in an unfused optimizer step, when its stacks show one: torch.optim's
    single- or multi-tensor implementation, or an optimizer of its own stepping from Python."""
    if not enough_stacks(ctx):
        return None
    kinds: Counter[tuple[str, str]] = Counter()
    own: dict[str, str] = {}
    for s in ctx.main_stacks:
        for f in s.frames:
            m = _UNFUSED.match(f.name) if _OPTIM_DIR in f.filename else None
            if m:
                kinds[(m.group(2), m.group(1))] += 1
                break
        else:
            found = _own_step(s.frames) if s.category is Category.OPTIMIZER else None
            if found is not None:
                kinds[(found[0], "own")] += 1
                own.setdefault(found[0], found[1])
    n = sum(kinds.values())
    if not n:
        return None
    (opt, impl), _ = kinds.most_common(1)[0]
    if impl == "own":
        return UnfusedStep(n / len(ctx.main_stacks), opt, True, n, own=(opt, own[opt]))
    return UnfusedStep(n / len(ctx.main_stacks), opt, impl == "single", n)


def optimizer_leads(ctx: AnalysisContext, dispatch_share: float) -> bool:
    """The unfused optimizer step is most of what the main thread launches."""
    step = unfused_step(ctx)
    return (step is not None and (step.optimizer in FUSED_OK or step.own is not None) and step.share >= UNFUSED_MIN_SHARE
            and dispatch_share > 0 and step.share / dispatch_share >= OPTIMIZER_LEADS_SHARE)


def optimizer_knob(framework: str | None, cls: str) -> str | None:
    if framework == HF_TRAINER:
        return 'TrainingArguments(..., optim="adamw_torch_fused")' if cls == "AdamW" else None
    if framework == LIGHTNING:
        return f"in configure_optimizers: torch.optim.{cls}(self.parameters(), ..., fused=True)"
    return None


@uses(UNFUSED_MIN_SHARE, MIN_MAIN_SAMPLES, GPM_BUSY_UTIL_PCT, LAUNCH_BOUND_SM_ACTIVE_PCT, MIN_COST_FRACTION,
      MIN_COST_S, MIN_RECURRENCES)
def check_unfused_optimizer(ctx: AnalysisContext) -> Hit | None:
    step = unfused_step(ctx)
    if step is None or (step.optimizer not in FUSED_OK and step.own is None) or step.share < UNFUSED_MIN_SHARE:
        return None
    # Its cost: what launching costs the GPU (idle while the main thread launched work, and
    # busy time with SMs starved by small kernels, as launch-bound counts it), the optimizer's
    # part of it by its share of the samples launching work. A GPU busy meanwhile with full SMs
    # (the CPU ahead of it) loses nothing to the loop: no finding.
    shares = ctx.main_shares()
    dispatch = sum(shares.get(c, 0.0) for c in (Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER, Category.OTHER))
    part = min(1.0, step.share / dispatch) if dispatch > 0 else 1.0

    def cost(g: GpuView) -> float:
        return (starved_sm_s(g) + g.breakdown.get(Bucket.CPU)) * part

    found = worst(ctx, cost, gpu_only=True)
    if found is None or not significant(found[0], found[1], buckets=(Bucket.CPU,)):
        return None
    g, c = found
    if step.own is not None:
        return _own_hit(ctx, step, g, c)
    cls = _CLASS.get(step.optimizer, step.optimizer)
    impl = (f"_single_tensor_{step.optimizer}: a Python loop over the parameters (foreach=False)" if step.loop
            else f"_multi_tensor_{step.optimizer}: the foreach default, kernels launched per group of tensors")
    plain = f"torch.optim.{cls}(model.parameters(), ..., fused=True)  # one kernel for all parameters (CUDA)"
    if cls == "AdamW":
        plain += "; Adam takes the same flag"
    knob = optimizer_knob(ctx.framework.name, cls)
    return _hit(ctx, step, g, c, f"main thread in the optimizer step {pct(step.share)} of its samples, in {impl}",
                f"{knob}; in plain PyTorch: {plain}" if knob else plain, "one kernel",
                f"Unfused optimizer: {cls}'s step launches kernels per tensor while {g.name} waits")


def _hit(ctx: AnalysisContext, step: UnfusedStep, g: GpuView, c: float, first: str, action: str, becomes: str,
         title: str) -> Hit:
    # The bound: the optimizer's launching time gone entirely (the fused kernel's own GPU time
    # is in the busy time either way). The stated bound takes the step's share of samples at its
    # upper confidence limit; the GPU's part (NVML's polls) as it is.
    frac = max(c / g.breakdown.total_s, step.share)
    upper = sampled_upper(step.share, len(ctx.main_stacks), c / g.breakdown.total_s)
    return Hit(
        evidence=(first, idle_line(g, [Bucket.CPU])),
        action=action,
        expected_gain=gain(frac, upper=upper) + f": the step's per-tensor launches become {becomes}",
        gain_bound=bounded(frac, upper=upper),
        cost_s=c,
        confidence=confidence(min(1.0, step.share * 2), len(ctx.main_stacks)),
        gpu_index=g.index,
        title=title,
    )


def _own_hit(ctx: AnalysisContext, step: UnfusedStep, g: GpuView, c: float) -> Hit:
    """An optimizer of its own stepping each tensor from Python (transformers' Adafactor: ~22 small
    kernels a tensor; a held-out T5 measured 1.28-1.44x with fused AdamW, bench/results/
    real_jobs_fresh11.md): the change is an implementation that steps the tensors together."""
    cls, where = step.own  # type: ignore[misc]
    if ctx.framework.name == HF_TRAINER:
        knob = ('TrainingArguments(..., optim="adamw_torch_fused") where AdamW\'s two states per parameter fit '
                f"({cls} was chosen to save them: if they do not fit, keep it; a larger batch amortises its step)")
    else:
        knob = ("the same algorithm stepping the tensors together: torch.optim's fused or foreach implementation "
                "(torch.optim.AdamW(..., fused=True), torch.optim.Adafactor(..., foreach=True)) where one exists; "
                "else torch.compile the optimizer step")
    return _hit(ctx, step, g, c,
                f"main thread in `{cls}.step` ({where}) {pct(step.share)} of its samples: an optimizer of its own, "
                "outside torch.optim, stepping each parameter tensor from Python", knob, "a few kernels",
                f"Unfused optimizer: `{cls}.step` launches kernels per tensor from Python while {g.name} waits")


# --------------------------------------------------------------------------- the optimizer offloaded

# Where the optimizer runs on the CPU by design: DeepSpeed's CPU Adam, or a sharded model (FSDP,
# FSDP2's fully_shard) whose parameters and states live in host memory (CPU offload).
_CPU_ADAM = "deepspeed/ops/adam/cpu_adam"
_FSDP_DIRS = ("torch/distributed/fsdp/", "torch/distributed/_composable/fsdp/")
OFFLOAD_MIN_SHARE = Threshold(
    0.30, "share", JUDGEMENT,
    "The main thread in the optimizer step at least this share of its samples, with its GPU idle meanwhile: the "
    "step is the job's time, not a part of it.")
OFFLOAD_GPU_IDLE = Threshold(
    0.5, "share", JUDGEMENT,
    "The GPU idle at least this share of the optimizer's share of the window: the step's arithmetic is not on the "
    "GPU (an unfused step on the GPU keeps it launching kernels).")


def _offload_kind(ctx: AnalysisContext) -> str | None:
    """"deepspeed" or "fsdp" when the main thread's stacks show a sharded model or DeepSpeed's CPU
    Adam; None: neither."""
    fsdp = False
    for s in ctx.main_stacks:
        for f in s.frames:
            path = f.filename.replace("\\", "/")
            if _CPU_ADAM in path:
                return "deepspeed"
            if any(d in path for d in _FSDP_DIRS):
                fsdp = True
    return "fsdp" if fsdp else None


# The GPU's median utilisation at the optimizer's samples at most this: it runs no kernel while the
# step runs (measured: FSDP2 CPU offload 0 %, a per-tensor step on the GPU 32-70 %). Judgement,
# between the two.
OFFLOAD_UTIL_MAX = Threshold(
    10.0, "%", JUDGEMENT,
    "The GPU's median utilisation at the optimizer step's samples at most this: it sees no kernel while the step "
    "runs (FSDP2 CPU offload measured 0 %, a per-tensor step on the GPU 32-70 %).")
# ...read at this many of the step's samples at least.
OFFLOAD_UTIL_SAMPLES = IntThreshold(
    5, "samples", JUDGEMENT,
    "The GPU's utilisation read at this many of the optimizer step's samples at least, for its median: 0 against "
    "32-70 % is told apart by a handful.")


def _in_optimizer(s: StackSample) -> bool:
    return any(_OPTIM_DIR in p or _CPU_ADAM in p for p in (f.filename.replace("\\", "/") for f in s.frames))


@uses(OFFLOAD_MIN_SHARE, OFFLOAD_GPU_IDLE, OFFLOAD_UTIL_MAX, OFFLOAD_UTIL_SAMPLES, MIN_MAIN_SAMPLES)
def check_optimizer_offload(ctx: AnalysisContext) -> Hit | None:
    """The optimizer step runs on the CPU over parameters kept in host memory (FSDP's CPU offload,
    DeepSpeed's offload_optimizer) while the GPU idles: offload trades the step's speed for GPU
    memory, and where the states fit, the trade is all cost."""
    if not enough_stacks(ctx):
        return None
    n = len(ctx.main_stacks)
    in_step = sum(1 for s in ctx.main_stacks if _in_optimizer(s))
    share = in_step / n
    if share < OFFLOAD_MIN_SHARE:
        return None
    gpus = [g for g in ctx.gpus if g.index >= 0 and g.breakdown.total_s > 0]
    if not gpus:
        return None
    def idle_of(x: GpuView) -> float:
        return 1.0 - x.breakdown.get(Bucket.BUSY) / x.breakdown.total_s

    g = max(gpus, key=idle_of)
    idle = idle_of(g)
    if idle < OFFLOAD_GPU_IDLE * share:
        return None
    kind = _offload_kind(ctx)
    during = median_util_at(g.slices, (s.ts for s in ctx.main_stacks if _in_optimizer(s)))
    if kind is None:
        # No sharding or DeepSpeed frame on the main thread (FSDP2's hooks run on autograd's
        # threads; the step's DTensor dispatch is too quick to be sampled): the GPU itself tells a
        # step on host tensors from one launching kernels, as it sees no kernel while the step runs.
        # Measured at the optimizer's samples: FSDP2 CPU offload 0 % (median of 92, H200), a
        # per-tensor step on the GPU 32-70 % (T5 Adafactor, GPT-2, DataParallel).
        if during is None or during[1] < OFFLOAD_UTIL_SAMPLES or during[0] > OFFLOAD_UTIL_MAX:
            return None
        kind = "host"
    e = g.efficiency
    mem = (f"{g.name}'s memory peaked at {pct(e.mem_peak_fraction)} of the card"
           if e.mem_peak_fraction is not None else f"{g.name}'s memory not read")
    if kind == "host":
        where, off = (f"its tensors in host memory ({g.name} {pct(during[0] / 100)} busy, median, while the step "
                      "runs)"), ("drop the offload that keeps them there: offload_policy=CPUOffloadPolicy() from "
                                 "fully_shard (FSDP2), cpu_offload=CPUOffload(offload_params=True) (FSDP1), "
                                 '"offload_optimizer" from a DeepSpeed config, or move a model or optimizer left on '
                                 "the CPU with .to('cuda') before the optimizer is built")
    elif kind == "deepspeed":
        where, off = "DeepSpeed's CPU Adam (DeepSpeedCPUAdam)", (
            'drop "offload_optimizer" (and "offload_param") from the DeepSpeed config\'s zero_optimization')
    else:
        where, off = "a sharded model's optimizer on CPU tensors (FSDP)", (
            "drop offload_policy=CPUOffloadPolicy() from fully_shard (FSDP2), or cpu_offload=CPUOffload("
            "offload_params=True) from FullyShardedDataParallel (FSDP1)")
    upper = sampled_upper(share, n)
    return Hit(
        evidence=(f"main thread in the optimizer step {pct(share)} of its samples: {where}",
                  f"{g.name} idle {pct(idle)} of the window: the step's arithmetic runs on the CPU",
                  mem + ": without offload each rank holds its shard of the parameters, gradients and "
                  "optimizer states (16 bytes a parameter for fp32 AdamW, divided by the ranks)"),
        action=(f"if the states fit on the GPUs, {off}: the step then runs on the GPU (fused there: "
                "torch.optim.AdamW(..., fused=True)); if they do not, keep the offload and make the CPU step "
                "cheaper: AdamW(..., fused=True) runs on CPU tensors too (torch >= 2.4)"),
        expected_gain=gain(share, upper=upper) + ": the CPU optimizer step's time, when it moves to the GPU",
        gain_bound=bounded(share, upper=upper),
        cost_s=share * (ctx.t1 - ctx.t0),
        confidence=0.75,
        gpu_index=g.index,
        title=f"The optimizer runs on the CPU ({pct(share)} of the time) while {g.name} idles: offloaded",
    )
