"""A GPU full of work whose tensor cores idle: its time goes to memory-bound kernels.

A model trained in bf16 spends its GPU time in matrix products on the tensor cores, and in the
elementwise, normalisation and softmax kernels between them, each of which reads and writes its
whole tensor through memory. Written by hand (a LayerNorm as ``mean``/``std``/``sub``/``div``, a
GELU as ``0.5 * x * (1 + tanh(...))``, attention as ``softmax(q @ k.T) @ v``), a single op becomes
a dozen such kernels; the GPU reads 100 % busy with its SMs full, and nothing but GPM says the
tensor cores sit idle meanwhile.

Measured on H200s (GPM over the window, bench/results/real_jobs_fresh*.md): healthy bf16
transformers kept the tensor cores 53-64 % active (DRAM 26-34 %); a GPT with hand-written
LayerNorm/GELU 14 % (DRAM 58 %; `nn.LayerNorm`/`nn.GELU` 1.98x), a hand-written attention 8.8 %
(SDPA 3.86x), a conv net under autocast in NCHW 6.8 % (channels_last 1.92x), a dense Adam over
huge embedding tables 0.6 % (a sparse optimizer 1.65x). What tells it from an fp32 job
(no-tensor-cores) is the fp32 pipes idle too; from float64, the FP64 units idle.

The change depends on the site, which the main thread's samples name where they can: the source
line of the user's own elementwise math (its text is read with the stack), convolutions, the
optimizer step. Where they name none, the finding says what it weighs instead.
"""

from __future__ import annotations

import re
from collections import Counter

from ...analysis import project_frame, short_path
from ...model import Category, Severity
from ..context import AnalysisContext, GpuView
from .base import (
    GPM_BUSY_UTIL_PCT, MIN_MAIN_SAMPLES, Hit, confidence, enough_stacks, pct, spinning, uses, worst,
)
from .precision import COMPUTE_BOUND_BUSY_SHARE, FP32_BUSY_PCT
from .threshold import JUDGEMENT, Threshold

# Where the GPM readings were measured: each held-out job's ``gpm_base``.
_GPM_SOURCE = ("bench/results/real_jobs_fresh11.json, bench/results/real_jobs_fresh10.json, "
               "bench/results/real_jobs_fresh9.json, bench/results/real_jobs_fresh8.json, "
               "bench/results/real_jobs_fresh.json (gpm_base)")
# The tensor cores at most this active on a GPU full of work. Healthy bf16 transformers measured
# 53-64 %, the four jobs whose time went to memory-bound kernels 0.6-14 %; a Llama whose
# torch.compile gained 1.12x read 28 %. Judgement: between 14 and 28, nearer the starved side.
TENSOR_STARVED_PCT = Threshold(
    20.0, "%", JUDGEMENT,
    "The tensor cores at most this active while the GPU is full: its time is in memory-bound kernels (healthy "
    "bf16 transformers 53-64 %, hand-written norms/attention, NCHW convs and a dense Adam 0.6-14 %).",
    _GPM_SOURCE)
# The SMs at least this active while busy: the GPU is full of work, not waiting between kernels
# (launch-bound jobs read 8-45 %, the starved-tensor-core jobs 78-96 %). Judgement.
SM_FULL_PCT = Threshold(
    75.0, "%", JUDGEMENT,
    "The SMs at least this active while busy: the GPU is full of work (launch-bound jobs 8-45 %, the jobs with "
    "memory-bound kernels 78-96 %).",
    _GPM_SOURCE)
# A site must hold at least this share of the forward's samples to be named. Judgement: in a GPU-
# bound job the main thread runs ahead and waits in backward most of the time, so the forward is
# a few samples a second; a third of them is a place, not noise.
SITE_SHARE = Threshold(
    0.3, "share", JUDGEMENT,
    "A site (the user's elementwise lines, convolutions) in at least this share of the forward's samples is named.")

# The text of a line doing elementwise or reduction math by hand: what a fused module replaces.
_ELEMENTWISE = re.compile(
    r"\.(mean|std|var|pow|sqrt|rsqrt|exp|tanh|sigmoid|softmax|masked_fill|norm)\(|"
    r"torch\.(tanh|pow|sqrt|rsqrt|exp|erf|sigmoid|softmax|where)\(|F\.softmax\(|math\.sqrt\(|\*\*\s*[23]\b")
# A module of the user's own named as a normalisation, activation or attention: torch's own are
# library frames, so a sample inside one of these is math the user wrote out op by op.
_HAND_WRITTEN = re.compile(r"(Norm|GELU|Gelu|SiLU|Swish|Mish|Softmax|Attention|Activation)\w*\.forward$")
# Fused calls on the line: the user's module delegates to one kernel, nothing to fuse.
_FUSED = re.compile(r"F\.(layer_norm|rms_norm|group_norm|gelu|silu|scaled_dot_product_attention)\(|"
                    r"torch\.nn\.functional\.|scaled_dot_product_attention")
_CONV = "/torch/nn/modules/conv.py"


def _by_hand(f) -> bool:
    """A frame of the user's code doing elementwise math itself: by its line's text, or by being
    inside a normalisation/activation/attention module of their own, unless the line calls a
    fused function."""
    code = f.code or ""
    if _FUSED.search(code):
        return False
    return bool(_ELEMENTWISE.search(code)) or bool(_HAND_WRITTEN.search(f.name))


def _starved(g: GpuView) -> float:
    """The GPU's busy seconds when it is full of work with its tensor, fp32 and fp64 units idle."""
    e, bd = g.efficiency, g.breakdown
    if (e.tensor_active is None or e.sm_active is None or e.util_busy_mean is None or spinning(g)
            or bd.total_s <= 0):
        return 0.0
    if e.util_busy_mean < GPM_BUSY_UTIL_PCT or bd.busy_s / bd.total_s < COMPUTE_BOUND_BUSY_SHARE:
        return 0.0
    if e.sm_active < SM_FULL_PCT or e.tensor_active > TENSOR_STARVED_PCT:
        return 0.0
    if (e.fp32_active or 0.0) >= FP32_BUSY_PCT or (e.fp64_active or 0.0) >= FP32_BUSY_PCT or (e.dfma_active or 0.0) > 1.0:
        return 0.0  # fp32 or float64 math: no-tensor-cores and float64-math name those
    return bd.busy_s


def _sites(ctx: AnalysisContext) -> tuple[list[tuple[str, int]], float, int]:
    """The user's elementwise lines in the forward's samples (label, count), the convolutions'
    share of them, and how many forward samples there were."""
    fwd = [s for s in ctx.main_stacks if s.category is Category.FORWARD]
    lines: Counter = Counter()
    first_line: dict[str, int] = {}
    conv = 0
    for s in fwd:
        if any(f.filename.replace("\\", "/").endswith(_CONV) for f in s.frames):
            conv += 1
        f = project_frame(s.frames)
        if f is not None and f is s.frames[0] and _by_hand(f):
            key = f"`{f.name}` ({short_path(f.filename)}"
            lines[key] += 1
            first_line[key] = min(first_line.get(key, f.line), f.line)
    n = len(fwd)
    named = [(f"{key}:{first_line[key]})", c) for key, c in lines.most_common()]
    return named, (conv / n if n else 0.0), n


@uses(TENSOR_STARVED_PCT, SM_FULL_PCT, SITE_SHARE, COMPUTE_BOUND_BUSY_SHARE, FP32_BUSY_PCT, GPM_BUSY_UTIL_PCT,
      MIN_MAIN_SAMPLES)
def check_memory_bound_kernels(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx):
        return None  # the site is the stacks'; without them the reading alone names no change
    found = worst(ctx, _starved, gpu_only=True)
    if found is None or found[1] <= 0:
        return None
    g, busy = found
    e = g.efficiency
    lines, conv_share, n = _sites(ctx)
    elementwise = sum(c for _, c in lines) / n if n else 0.0
    ev = [f"{g.name} busy {e.util_busy_mean:.0f} % with its SMs {e.sm_active:.0f} % active but the tensor cores only "
          f"{e.tensor_active:.0f} % (fp32 pipes {e.fp32_active or 0.0:.0f} %, DRAM {e.dram_active or 0.0:.0f} %): the "
          "time goes to memory-bound kernels, not matrix products (healthy bf16 transformers: tensor cores 53-64 %)"]
    seen_in = "the stacks show where"
    if elementwise >= SITE_SHARE:
        top = ", ".join(label for label, _ in lines[:2])
        ev.append(f"the forward's samples in elementwise math written by hand {pct(elementwise)} of the time: {top}")
        action = ("replace the hand-written ops with fused ones: nn.LayerNorm / nn.RMSNorm, nn.GELU(approximate="
                  "\"tanh\") / F.silu, F.scaled_dot_product_attention for softmax(q @ k.T) @ v; or torch.compile(model), "
                  "which fuses such chains into one kernel each")
        title = f"{g.name} busy on memory-bound kernels: elementwise math written by hand (tensor cores {e.tensor_active:.0f} %)"
        severity = None
    elif conv_share >= SITE_SHARE:
        ev.append(f"the forward's samples inside convolutions {pct(conv_share)} of the time")
        # Weighed, not warned: nothing sampled says whether the tensors are NCHW already (a healthy
        # channels_last conv net's tensor-core share was not measured here).
        action = ("if the model and its batches are in the default NCHW layout: channels_last, model = "
                  "model.to(memory_format=torch.channels_last) and each batch x = x.to(device, "
                  "memory_format=torch.channels_last) (under autocast cuDNN's tensor-core kernels want NHWC, and "
                  "NCHW pays a layout transpose around each convolution); if they are channels_last already, "
                  "torch.profiler over a few steps names the kernels that take the time")
        title = (f"Weighing: {g.name} full but its tensor cores {e.tensor_active:.0f} % active around the "
                 "convolutions: NCHW layout transposes, or other memory-bound kernels")
        severity = Severity.INFO
    else:
        seen_in = "the stacks name no site yet"
        ev.append("the main thread's samples name no elementwise line or convolution: the kernels to fuse are not "
                  "known from here")
        action = ("not yet told apart: torch.profiler over a few steps (sort by CUDA time) names the kernels; the usual "
                  "ones are hand-written norms, activations or attention (fused modules or torch.compile), NCHW "
                  "convolutions under autocast (channels_last), or an optimizer over large dense tables (a sparse one)")
        title = f"Weighing: {g.name} full but its tensor cores {e.tensor_active:.0f} % active"
        severity = Severity.INFO
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=(f"not bounded from here ({seen_in}); on four held-out jobs with this reading the change that "
                       "fitted measured 1.65-3.86x"),
        gain_bound=None,
        # The busy time the lowest measured gain (1.65x) takes away: a floor to rank it by.
        cost_s=busy * (1 - 1 / 1.65),
        confidence=confidence(max(elementwise, conv_share, 0.3), len(ctx.main_stacks)),
        gpu_index=g.index,
        severity=severity,
        title=title,
    )
