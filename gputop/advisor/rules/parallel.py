"""One process driving several GPUs through ``nn.DataParallel``.

``torch.nn.DataParallel`` copies the model to every GPU at each forward (``replicate``), splits the
batch (``scatter``), runs one Python thread per GPU (``parallel_apply``), gathers the outputs on the
first GPU and sums the gradients back there in the backward. All of it is one process's Python
under one GIL: the GPUs take turns waiting for it. PyTorch's documentation recommends
DistributedDataParallel (one process per GPU) even on one machine.

It is also where a job lands without anyone asking: Hugging Face's Trainer started with plain
``python train.py`` on a host with several visible GPUs wraps the model in DataParallel over all of
them. A held-out T5 (Seq2SeqTrainer, bf16) did so on two H200s and ran at 87 samples/s, half of what
one GPU alone did (173, ``CUDA_VISIBLE_DEVICES=0``); gputop told it "tensor cores idle: use bf16"
(bf16 was on) and launch-bound (bench/results/real_jobs_fresh11.md).

What tells it apart: the main thread inside torch/nn/parallel's own Python (replicating, scattering,
joining the replicas' threads), which no other way of training calls. DataParallel over one GPU
calls the module directly (no replicate, no threads): that is not this finding.
"""

from __future__ import annotations

from ...analysis import HF_TRAINER, LIGHTNING
from ..context import AnalysisContext, GpuView
from .base import (
    MIN_COST_FRACTION, MIN_COST_S, Hit, confidence, enough_stacks, pct, significant, idle_unless_spinning, uses, worst,
)
from .threshold import JUDGEMENT, Threshold

# The main thread inside DataParallel's machinery at least this share of its samples. Replicating a
# model and joining one thread per GPU is a large part of every step (the held-out T5: 33 % of its
# main thread's samples in replicate/parallel_apply/scatter alone, the rest of DataParallel's forward
# inside the replicas' threads); nothing else calls that code, so the bar only stands above a stray
# sample. Judgement.
DATA_PARALLEL_SHARE = Threshold(
    0.10, "share", JUDGEMENT,
    "The main thread inside nn.DataParallel's replicate/scatter/parallel_apply/gather at least this share of its "
    "samples: nothing but DataParallel over several GPUs runs that code (the held-out T5 under HF Trainer 33 %).",
    "bench/results/real_jobs_fresh11.md")

_PARALLEL_DIR = "/torch/nn/parallel/"
# Its files; distributed.py (DistributedDataParallel) is the change, not the cause.
_DP_FILES = ("data_parallel.py", "replicate.py", "parallel_apply.py", "scatter_gather.py", "comm.py")
# What only runs when DataParallel has more than one GPU: over one it calls the module directly.
_MULTI_GPU = ("replicate", "parallel_apply", "scatter", "scatter_kwargs", "gather", "_broadcast_coalesced_reshape")


def _path(f) -> str:
    return f.filename.replace("\\", "/")


def in_data_parallel(frames) -> bool:
    """A sample inside nn.DataParallel's own Python (its forward's replicate, scatter, threads, gather)."""
    return any(_PARALLEL_DIR in _path(f) and _path(f).rsplit("/", 1)[-1] in _DP_FILES for f in frames)


def _over_several(frames) -> bool:
    return any(_PARALLEL_DIR in _path(f) and f.name.rsplit(".", 1)[-1] in _MULTI_GPU for f in frames)


def data_parallel_seen(ctx: AnalysisContext) -> bool:
    """Any of the main thread's samples inside DataParallel's multi-GPU machinery: what each GPU's
    own readings say (precision, launches) is then read through one process's bottleneck."""
    return any(in_data_parallel(s.frames) and _over_several(s.frames) for s in ctx.main_stacks)



def _action(framework: str | None, n: int) -> str:
    many = f"{n}" if n > 1 else "N"
    if framework == HF_TRAINER:
        return (f"start the script with `torchrun --nproc-per-node {many} train.py` (or `accelerate launch`): the "
                "Trainer then runs DistributedDataParallel, one process per GPU; to train on one GPU, "
                "`CUDA_VISIBLE_DEVICES=0 python train.py` (started with plain `python` on a host with several GPUs "
                "the Trainer wraps the model in nn.DataParallel)")
    if framework == LIGHTNING:
        return f"Trainer(strategy=\"ddp\", devices={many}) instead of strategy=\"dp\": one process per GPU"
    return ("replace nn.DataParallel(model) with DistributedDataParallel: one process per GPU, started by "
            f"`torchrun --nproc-per-node {many} train.py` (init_process_group(\"nccl\"), "
            "DDP(model, device_ids=[local_rank]), a DistributedSampler); PyTorch recommends it over DataParallel "
            "even on one machine")


@uses(DATA_PARALLEL_SHARE, MIN_COST_FRACTION, MIN_COST_S)
def check_data_parallel(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx):
        return None
    main = ctx.main_stacks
    inside = [s for s in main if in_data_parallel(s.frames)]
    share = len(inside) / len(main)
    if share < DATA_PARALLEL_SHARE or not any(_over_several(s.frames) for s in inside):
        return None
    found = worst(ctx, idle_unless_spinning, gpu_only=True)
    if found is None or not significant(found[0], found[1]):
        return None
    g, cost = found
    gpus = sorted(v.index for v in ctx.gpus if v.breakdown.total_s > 0)
    n = len(gpus)
    idle = g.breakdown.idle_s / g.breakdown.total_s
    busy = 1.0 - idle
    floor = f"at least {1.0 / busy:.1f}x on {g.name}" if busy > 0 else "large"
    on = f"GPUs {', '.join(map(str, gpus))}" if n > 1 else "several GPUs"
    return Hit(
        evidence=(
            f"main thread inside nn.DataParallel (replicating the model, scattering the batch, joining one thread "
            f"per GPU) in {pct(share)} of its samples: one process drives {on}",
            f"{g.name} idle {pct(idle)} of the last {g.breakdown.total_s:.0f} s",
        ),
        action=_action(ctx.framework.name, n),
        expected_gain=(f"{floor}: each GPU gets a process of its own and the per-step copies of the model go; "
                       "a held-out T5 under DataParallel on two H200s ran at half the speed of one GPU alone"),
        gain_bound=None,
        cost_s=cost,
        confidence=confidence(share, len(main)),
        gpu_index=g.index,
        title=f"nn.DataParallel: one process drives {on} ({g.name} idle {pct(idle)})",
    )
