"""Precision: a GPU busy with fp32 math on its CUDA cores (no TF32, no bf16/fp16), and a
framework job that its own stacks show training in fp32."""

from __future__ import annotations

from ...analysis import FP32, HALF, MIXED, precision_knob
from ..context import AnalysisContext, GpuView
from .base import (
    GPM_BUSY_UTIL_PCT, MIN_COST_FRACTION, MIN_COST_S, MIN_MAIN_SAMPLES, SPIN_EXPLAINS, Hit, enough_stacks, pct,
    significant, spinning, times, uses, worst,
)
from .parallel import data_parallel_seen
from .threshold import DERIVED, DOCUMENTED, JUDGEMENT, IntThreshold, Threshold

# The fp32 pipes at least this busy, and busier than the tensor cores: the math runs in fp32 on
# the CUDA cores. Measured (GPM, H100): fp32 loops and fp32 transformers 54-76 % with tensor
# cores 0-1 %; bf16 and TF32 jobs 1.4-3.4 % (bench/results/advisor_bench.json,
# bench/results/real_jobs.json); 20 is judgement. "Busier than the tensor cores" and not
# "tensor cores idle": PyTorch's defaults run convolutions as TF32 (cudnn.allow_tf32) but
# matmuls in full fp32 (matmul.allow_tf32 off), so a model with a conv stem and fp32 linears
# shows some tensor activity while most of its math runs on the CUDA cores.
FP32_BUSY_PCT = Threshold(
    20.0, "%", JUDGEMENT,
    "The fp32 pipes at least this busy, and busier than the tensor cores: the math runs in fp32 on the CUDA "
    "cores (fp32 jobs read 54-76 %, bf16 and TF32 ones 1.4-3.4 %).",
    "bench/results/advisor_bench.json, bench/results/real_jobs.json")
# Saved share of busy time when fp32 matmuls move to tensor cores. NVIDIA's H100 SXM datasheet:
# 67 TFLOPS fp32 vs 989 TFLOPS TF32 with sparsity, ~495 dense (~7x). Real steps are part matmul,
# so half of the busy time is a conservative estimate of what TF32/bf16 gives back: judgement.
TENSOR_CORE_SAVING = Threshold(
    0.5, "share", JUDGEMENT,
    "The busy time TF32/bf16 gives back, as the estimate: tensor cores run matmuls ~7x fp32's rate, but real "
    "steps are part matmul.", "NVIDIA H100 SXM datasheet")
# The most tensor cores can speed up fp32 math: bf16 dense vs fp32 on NVIDIA's H100 SXM
# datasheet, 989 / 67 TFLOPS (~15x; TF32 dense ~7x, V100 fp16 tensor vs fp32 125 / 15.7 ~8x).
# The bound takes all of the busy time as such math; real steps are part matmul, so the gain is
# far less (TENSOR_CORE_SAVING is the estimate the text gives beside it).
TENSOR_CORE_MAX_SPEEDUP = Threshold(
    15.0, "x", DOCUMENTED,
    "The most tensor cores can speed up fp32 math: bf16 dense against fp32, 989 / 67 TFLOPS; the upper bound "
    "takes all of the busy time as such math.", "NVIDIA H100 SXM datasheet")
# TF32 needs Ampere (compute capability 8.0); tensor cores exist from Volta (7.0): NVIDIA's
# architecture whitepapers and the CUDA programming guide's compute-capability table.
TF32_MIN_CC = (8, 0)
TENSOR_CORE_MIN_CC = (7, 0)
CONFIDENT_BUSY_POLLS = IntThreshold(
    5, "polls", JUDGEMENT, "The finding is sure (0.9, else 0.7) once GPM has averaged this many busy polls.")


def _computing(g: GpuView) -> bool:
    """Busy by GPM's polls and not waiting in a spinning kernel: its pipes' readings are work."""
    e = g.efficiency
    return e.util_busy_mean is not None and e.util_busy_mean >= GPM_BUSY_UTIL_PCT and not spinning(g)


def _faster_math(g: GpuView, max_speedup: float) -> tuple[float, float]:
    """(upper bound, estimate) of steps/s when the busy time's math moves to faster units: at
    most all of the busy time ``max_speedup`` times faster; about TENSOR_CORE_SAVING of it back.
    The idle time stays."""
    bd = g.breakdown
    bound = bd.total_s / max(1e-9, bd.total_s - bd.busy_s * (1 - 1 / max_speedup))
    estimate = bd.total_s / max(1e-9, bd.total_s - bd.busy_s * TENSOR_CORE_SAVING)
    return bound, estimate


@uses(FP32_BUSY_PCT, TENSOR_CORE_SAVING, TENSOR_CORE_MAX_SPEEDUP, CONFIDENT_BUSY_POLLS, GPM_BUSY_UTIL_PCT,
      SPIN_EXPLAINS, MIN_MAIN_SAMPLES)
def check_no_tensor_cores(ctx: AnalysisContext) -> Hit | None:
    if ctx.target_pid is not None and not enough_stacks(ctx):
        # Attached, the stacks decide between the causes of idle tensor cores: autocast already on
        # (below), or nn.DataParallel, whose replicas' threads ran a bf16 HF Trainer job in fp32 on
        # two H200s (told "use bf16"; the change was DataParallel's). Until they are in, the GPM
        # reading alone cannot tell them apart.
        return None
    if data_parallel_seen(ctx):
        # Seen once is enough: under DataParallel the replicas' threads, not the job's settings,
        # decide what runs (bf16 on, the math in fp32); data-parallel names the change.
        return None
    if ctx.framework.precision in (MIXED, HALF):
        # The stacks show the forward under autocast (or a scaler): the fp32 pipes are busy with
        # what autocast leaves in fp32 (softmax, norms, the loss, the optimizer), not with matmuls
        # it could move; "use autocast" would be a wrong cause (measured: an HF Trainer job with
        # bf16=True was told it on an H100, its fp32 pipes 49 % active).
        return None

    def cost(g: GpuView) -> float:
        e = g.efficiency
        # 'busy' waiting in a spinning kernel has no math to move to tensor cores
        if e.tensor_active is None or not _computing(g):
            return 0.0
        fp32 = e.fp32_active or 0.0
        if fp32 < FP32_BUSY_PCT or fp32 <= e.tensor_active:
            return 0.0
        cc = e.compute_capability
        if cc is not None and tuple(cc) < TENSOR_CORE_MIN_CC:
            return 0.0
        return g.breakdown.busy_s * TENSOR_CORE_SAVING

    found = worst(ctx, cost, gpu_only=True)
    if found is None or found[1] <= 0:
        return None
    g, c = found
    e = g.efficiency
    cc = e.compute_capability
    tf32 = cc is None or tuple(cc) >= TF32_MIN_CC
    ev = [
        f"{g.name} busy {e.util_busy_mean:.0f} % with the fp32 pipes {e.fp32_active:.0f} % active and the "
        f"tensor cores {e.tensor_active:.1f} % (GPM, {e.busy_polls} busy poll{'' if e.busy_polls == 1 else 's'}): the math runs on the CUDA cores",
        f"compute capability {cc[0]}.{cc[1]}: tensor cores{' with TF32' if tf32 else ''} available"
        if cc else "tensor cores available on this GPU",
    ]
    fw = ctx.framework
    if tf32:
        action = (
            'with torch.autocast("cuda", dtype=torch.bfloat16): around forward and loss; or at least '
            "torch.backends.cuda.matmul.allow_tf32 = True and torch.backends.cudnn.allow_tf32 = True "
            '(= torch.set_float32_matmul_precision("high"))'
        )
    else:
        action = (
            'with torch.autocast("cuda", dtype=torch.float16): around forward and loss, with '
            'scaler = torch.amp.GradScaler("cuda"); scaler.scale(loss).backward(); scaler.step(opt); scaler.update()'
        )
    knob = precision_knob(fw.name, bf16=tf32)
    if knob and fw.precision not in (MIXED, HALF):
        action = f"{knob}; in plain PyTorch: {action}"
    # Upper bound: every busy second were fp32 math and ran TENSOR_CORE_MAX_SPEEDUP times faster.
    bound, estimate = _faster_math(g, TENSOR_CORE_MAX_SPEEDUP)
    return Hit(
        evidence=tuple(ev),
        action=action,
        gain_bound=bound,
        expected_gain="matmuls move to the tensor cores (several times the fp32 rate): "
        f"roughly {pct(TENSOR_CORE_SAVING)} of the busy time back in matmul-heavy steps, about {times(estimate)} "
        f"steps/s (an estimate); at most {times(bound)} (an upper bound: all of the busy time fp32 math, "
        f"{TENSOR_CORE_MAX_SPEEDUP:.0f}x faster)",
        cost_s=c,
        confidence=0.9 if e.busy_polls >= CONFIDENT_BUSY_POLLS else 0.7,
        gpu_index=g.index,
        title=f"{g.name} busy but tensor cores idle: fp32 math",
    )



# ---------------------------------------------------------------------- fp32 seen in the stacks

# bf16 runs the tensor cores at twice TF32's rate and moves half the bytes per element, so a
# step whose busy time is all TF32 convs and fp32 elementwise work at most halves: the bound is
# 2x of the busy time (NVIDIA H100 datasheet: 989 vs 495 dense TFLOPS for bf16 vs TF32; A100
# 312 vs 156). Real steps have parts neither helps (reductions in fp32, the optimizer).
BF16_OVER_TF32_MAX = Threshold(
    2.0, "x", DOCUMENTED,
    "bf16 runs the tensor cores at twice TF32's rate and moves half the bytes: a step of TF32 and fp32 work at "
    "most halves.", "NVIDIA H100 datasheet (989 vs 495 dense TFLOPS); A100 (312 vs 156)")
# A GPU this busy (busy polls' mean utilisation, GPM_BUSY_UTIL_PCT) and busy this share of the
# window: a compute-bound job, where precision is the lever.
COMPUTE_BOUND_BUSY_SHARE = Threshold(
    0.8, "share", JUDGEMENT,
    "A GPU busy this share of the window is compute-bound, where precision is the lever; below it the idle "
    "time's cause is the finding to make first.")


@uses(COMPUTE_BOUND_BUSY_SHARE, BF16_OVER_TF32_MAX, FP32_BUSY_PCT, GPM_BUSY_UTIL_PCT, SPIN_EXPLAINS,
      MIN_COST_FRACTION, MIN_COST_S)
def check_fp32_training(ctx: AnalysisContext) -> Hit | None:
    """A framework job whose stacks show fp32 training (Lightning "32-true", Trainer without
    bf16) on a compute-bound GPU that the fp32-pipe check does not already name."""
    fw = ctx.framework
    if fw.precision != FP32:
        return None

    def cost(g: GpuView) -> float:
        e, bd = g.efficiency, g.breakdown
        if e.util_busy_mean is None or e.util_busy_mean < GPM_BUSY_UTIL_PCT or bd.total_s <= 0 or spinning(g):
            return 0.0
        if bd.busy_s / bd.total_s < COMPUTE_BOUND_BUSY_SHARE:
            return 0.0
        cc = e.compute_capability
        if cc is not None and tuple(cc) < TF32_MIN_CC:
            return 0.0  # no bf16 tensor cores before Ampere; fp16 needs a scaler: another finding
        if e.fp32_active is not None and e.fp32_active >= FP32_BUSY_PCT and e.fp32_active > (e.tensor_active or 0.0):
            return 0.0  # no-tensor-cores names it, with its larger bound
        return g.breakdown.busy_s * (1 - 1 / BF16_OVER_TF32_MAX)

    found = worst(ctx, cost, gpu_only=True)
    if found is None or found[1] <= 0 or not significant(found[0], found[1]):
        return None
    g, c = found
    e, bd = g.efficiency, g.breakdown
    bound = bd.total_s / max(1e-9, bd.total_s - c)
    knob = precision_knob(fw.name, bf16=True)
    gpm = ""
    if e.tensor_active is not None and e.fp32_active is not None:
        gpm = f"; tensor cores {e.tensor_active:.0f} %, fp32 pipes {e.fp32_active:.0f} % (TF32 convolutions look like this)"
    return Hit(
        evidence=(
            f"{fw.evidence}: the job trains in fp32",
            f"{g.name} busy {pct(bd.busy_s / bd.total_s)} of the last {bd.total_s:.0f} s, "
            f"{e.util_busy_mean:.0f} % utilisation{gpm}",
        ),
        action=f'{knob}; in plain PyTorch: with torch.autocast("cuda", dtype=torch.bfloat16): around forward and loss'
        + ("; for convolutions also model.to(memory_format=torch.channels_last)" if (e.tensor_active or 0) > 0 else ""),
        gain_bound=bound,
        expected_gain=f"bf16 doubles the tensor cores' rate over TF32 and halves the bytes each op moves: at most "
        f"{times(bound)} steps/s (an upper bound: all of the busy time halved); less where the step is "
        "reductions, the optimizer or data movement bf16 does not shorten",
        cost_s=c,
        confidence=0.7,
        gpu_index=g.index,
        title=f"{g.name} compute-bound in fp32: bf16 mixed precision",
    )


# ---------------------------------------------------------------------- float64 math

# The FP64 tensor cores and FP64 pipes together at least this active while the GPU is busy: the
# model's math runs in float64 (`model.double()`, float64 batches from numpy or pandas), which
# autocast leaves alone. Training in float64 is almost never meant; bf16 and float32 jobs read 0.
# A held-out float64 job on an H200 read 55 % on GPM's any-tensor metric (its DMMA matmuls) and
# 0.1 % on the fp32 pipes, like a bf16 job: the FP64 readings are what tell them apart. Judgement,
# as FP32_BUSY_PCT; the FP64 readings themselves not yet measured on a real float64 job.
FP64_BUSY_PCT = Threshold(
    20.0, "%", JUDGEMENT,
    "The FP64 tensor cores and FP64 pipes together at least this active while busy: the math runs in float64 "
    "(bf16 and float32 jobs read 0; not yet measured on a real float64 job).")
# The most leaving float64 can give: bf16 dense tensor cores against the FP64 tensor cores, NVIDIA's
# H100 SXM datasheet 989 / 67 TFLOPS; the upper bound takes all of the busy time as such math.
FP64_MAX_SPEEDUP = Threshold(
    14.8, "x", DOCUMENTED,
    "The most float64 math gains in bf16: the tensor cores' 989 against the FP64 tensor cores' 67 dense TFLOPS; "
    "the upper bound takes all of the busy time as such math.", "NVIDIA H100 SXM datasheet")


# What the busy time outside float64 math gains in float32: its memory-bound kernels move half the
# bytes (4 against 8 per element). Derived from the types' sizes.
FP64_BYTES_RATIO = Threshold(
    2.0, "x", DERIVED,
    "What float32 gives the busy time outside float64 math: memory-bound kernels move 4 bytes per element, not 8.")


def _float64_estimate(g: GpuView) -> float:
    """Steps/s as a factor once float64 goes: the share of the busy time in FP64 math (the FP64
    units' activity over the SMs') at FP64_MAX_SPEEDUP, the rest at FP64_BYTES_RATIO, the idle time
    as it is. Measured against it: a float64 MLP on an H200 read 64 % (FP64 59 of SM 93), this
    says 4.3x, float32 + bf16 autocast measured 5.91x (bench/results/real_jobs_fresh6.md)."""
    e, bd = g.efficiency, g.breakdown
    active = (e.dfma_active or 0.0) + (e.fp64_active or 0.0)
    share = min(1.0, active / e.sm_active) if e.sm_active else 1.0
    after = bd.busy_s * (share / FP64_MAX_SPEEDUP + (1.0 - share) / FP64_BYTES_RATIO)
    return bd.total_s / max(1e-9, bd.total_s - bd.busy_s + after)


@uses(FP64_BUSY_PCT, FP64_MAX_SPEEDUP, FP64_BYTES_RATIO, TENSOR_CORE_SAVING, GPM_BUSY_UTIL_PCT, SPIN_EXPLAINS,
      CONFIDENT_BUSY_POLLS)
def check_float64_math(ctx: AnalysisContext) -> Hit | None:
    def fp64(g: GpuView) -> float:
        e = g.efficiency  # no FP64 readings (older GPM): 0, nothing said
        return (e.dfma_active or 0.0) + (e.fp64_active or 0.0)

    def cost(g: GpuView) -> float:
        if not _computing(g) or fp64(g) < FP64_BUSY_PCT:
            return 0.0
        return g.breakdown.busy_s * TENSOR_CORE_SAVING

    found = worst(ctx, cost, gpu_only=True)
    if found is None or found[1] <= 0:
        return None
    g, c = found
    e = g.efficiency
    bound, _ = _faster_math(g, FP64_MAX_SPEEDUP)
    estimate = min(bound, _float64_estimate(g))
    return Hit(
        evidence=(
            f"{g.name} busy {e.util_busy_mean:.0f} % with its FP64 tensor cores {e.dfma_active or 0:.0f} % and FP64 "
            f"pipes {e.fp64_active or 0:.0f} % active (GPM, {e.busy_polls} busy poll{'' if e.busy_polls == 1 else 's'}): "
            "the math runs in float64",
            "autocast leaves float64 tensors in float64, and no fused attention kernel takes them",
        ),
        action=("keep the model and its inputs in float32: drop model.double() (or .to(torch.float64)), cast "
                "float64 arrays once when loading (torch.from_numpy(x).float(), df.to_numpy(dtype='float32')), and "
                'train under with torch.autocast("cuda", dtype=torch.bfloat16):'),
        expected_gain=f"about {times(estimate)} steps/s (an estimate: the FP64 units' share of the busy time "
                      f"{FP64_MAX_SPEEDUP:.0f}x faster, the rest moving half the bytes); at most "
                      f"{times(bound)} (an upper bound: all of the busy time float64 math, "
                      f"{FP64_MAX_SPEEDUP:.0f}x faster in bf16)",
        gain_bound=bound,
        cost_s=c,
        confidence=0.9 if e.busy_polls >= CONFIDENT_BUSY_POLLS else 0.7,
        gpu_index=g.index,
        title=f"{g.name} computes in float64",
    )
