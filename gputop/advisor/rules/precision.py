"""Precision: a GPU busy with fp32 math while its tensor cores idle (no TF32, no bf16/fp16)."""

from __future__ import annotations

from ..context import AnalysisContext, GpuView
from .base import GPM_BUSY_UTIL_PCT, Hit, pct, times, worst

# Tensor-core activity (GPM) at or below this while busy is "not used". Measured: the fp32
# matmul loop read 0.0 %, the healthy bf16 trainer 62 % (bench/results/harness.md); the 2 % of
# slack is judgement.
TENSOR_IDLE_PCT = 2.0
# ...with the fp32 pipes at least this busy: the math is running, in fp32. Measured: the fp32
# loop read 76 % (bench/results/advisor_bench.json); 20 is judgement.
FP32_BUSY_PCT = 20.0
# Saved share of busy time when fp32 matmuls move to tensor cores. NVIDIA's H100 SXM datasheet:
# 67 TFLOPS fp32 vs 989 TFLOPS TF32 with sparsity, ~495 dense (~7x). Real steps are part matmul,
# so half of the busy time is a conservative estimate of what TF32/bf16 gives back: judgement.
TENSOR_CORE_SAVING = 0.5
# The most tensor cores can speed up fp32 math: bf16 dense vs fp32 on NVIDIA's H100 SXM
# datasheet, 989 / 67 TFLOPS (~15x; TF32 dense ~7x, V100 fp16 tensor vs fp32 125 / 15.7 ~8x).
# The bound takes all of the busy time as such math; real steps are part matmul, so the gain is
# far less (TENSOR_CORE_SAVING is the estimate the text gives beside it).
TENSOR_CORE_MAX_SPEEDUP = 15.0
# TF32 needs Ampere (compute capability 8.0); tensor cores exist from Volta (7.0): NVIDIA's
# architecture whitepapers and the CUDA programming guide's compute-capability table.
TF32_MIN_CC = (8, 0)
TENSOR_CORE_MIN_CC = (7, 0)
# The finding is sure (0.9, else 0.7) once GPM has averaged this many busy polls. Judgement.
CONFIDENT_BUSY_POLLS = 5


def check_no_tensor_cores(ctx: AnalysisContext) -> Hit | None:
    def cost(g: GpuView) -> float:
        e = g.efficiency
        if e.tensor_active is None or e.util_busy_mean is None or e.util_busy_mean < GPM_BUSY_UTIL_PCT:
            return 0.0
        if e.tensor_active > TENSOR_IDLE_PCT or (e.fp32_active or 0.0) < FP32_BUSY_PCT:
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
        f"{g.name} busy {e.util_busy_mean:.0f} % while tensor cores are active {e.tensor_active:.1f} % "
        f"and the fp32 pipes {e.fp32_active:.0f} % (GPM, {e.busy_polls} busy polls)",
        f"compute capability {cc[0]}.{cc[1]}: tensor cores{' with TF32' if tf32 else ''} available"
        if cc else "tensor cores available on this GPU",
    ]
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
    bd = g.breakdown
    # Upper bound: every busy second were fp32 math and ran TENSOR_CORE_MAX_SPEEDUP times faster;
    # the idle time stays. The estimate: TENSOR_CORE_SAVING of the busy time back.
    bound = bd.total_s / max(1e-9, bd.total_s - bd.busy_s * (1 - 1 / TENSOR_CORE_MAX_SPEEDUP))
    estimate = bd.total_s / max(1e-9, bd.total_s - bd.busy_s * TENSOR_CORE_SAVING)
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

