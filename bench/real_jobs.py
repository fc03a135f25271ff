"""Is the advisor right on jobs written the way real frameworks and public examples write them?

Each job of ``JOBS`` (scripts in bench/jobs/) runs twice on the GPU: as written, and with the one
change its truth names applied (bf16, more loader workers, pinned memory, fewer checkpoints ...).
The measured speed-up of that change is the truth: at least ``HEALTHY_BELOW`` (10 %) and the job's
right verdict is the change's finding; less and the job is healthy, and any warning is wrong.
While the job runs as written, ``gputop advise --pid P --json`` (no option overridden) is attached
after the job's warm-up; its top-finding timeline gives the verdict and the time from attach to the
first correct top finding.

Jobs marked ``held_out`` were written and measured before any rule was changed for them; no
threshold is tuned on them, and they are reported apart. Jobs marked ``fresh`` are held out too,
and were written without reading how the advisor decides anything; they are reported apart again.

A truth can also be declared instead of measured: a job whose change is labelled ``stuck`` hangs
(a kernel that never finishes); nothing makes it faster, that change is not run, and the job's
right top finding is ``stuck``. A job marked ``attach_early`` prints ``gputop-workload attach``
where its warm-up starts (a long ``torch.compile``): the advisor is attached there, and its
throughput is measured after its ready line as for every job.

    python bench/real_jobs.py --out DIR                       # every job, gains and verdicts
    python bench/real_jobs.py --out DIR --gains-from FILE     # verdicts only; gains from FILE
    python bench/real_jobs.py --out DIR --jobs a,b --device cpu --tiny   # smoke test, no GPU

Writes DIR/real_jobs.json and DIR/real_jobs.md. No network needed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOBS_DIR = os.path.join(HERE, "jobs")

# A change that speeds the job up by less than this leaves it healthy (the developers' guide).
HEALTHY_BELOW = 1.10
# Targets of the real-jobs issue.
TARGET_HELD_OUT = 0.80
TARGET_T_CORRECT_S = 5.0
MEASURE_S = 5.0  # throughput window, per variant
ADVISE_S = 10.0  # advise --duration: twice the target for the first right finding
READY_TIMEOUT_S = 240.0
BLOCKING = ("warning", "critical")

# What a truth accepts as the right top finding: the findings whose action is that change.
TRUTH_FINDINGS: dict[str, tuple[str, ...]] = {
    "precision": ("no-tensor-cores", "mixed-precision"),
    "data": ("data-starved", "workers-saturated"),
    "pageable": ("pageable-h2d",),
    "checkpoint": ("checkpoint-stall",),
    "host-sync": ("host-sync",),
    "launch": ("launch-bound",),
    "optimizer": ("unfused-optimizer",),
    # The fresh held-out jobs' truths, mapped to the findings whose action is that change (the
    # jobs' writer named ids a perfect tool would use; these are gputop's own for the same change).
    "stuck": ("stuck",),
    "cpu-in-loop": ("cpu-work-in-loop",),
    "workers-respawn": ("loader-respawn",),  # its action: DataLoader(..., persistent_workers=True)
    "empty-cache": ("host-sync",),  # its action names the empty_cache() line when that is the sync
    "eval-every-step": ("eval-every-step",),  # its action: evaluate every N steps
    # The fifth fresh set's (2026-11-27): no finding's action is a fused attention kernel, so that
    # truth is a miss until one is built for the class.
    "attention": (),
    # The sixth fresh set's (mapped 2026-11-27, before any measurement): the logits copied to the
    # host every step are fixed by either finding whose action stops that copy or that CPU work;
    # no finding's action is float32 instead of float64, padding per batch, or shapes that stop
    # cuDNN's autotuning, so those truths are misses until a finding for the class is built.
    "metrics-on-cpu": ("host-sync", "cpu-work-in-loop"),
    # float64-math was built after the sixth set's first measurement, from its held-out miss.
    "float64": ("float64-math",),
    "padding": (),
    # Built after the sixth set's first measurement (2026-11-28), from its held-out miss: the job is
    # in-sample for it from then on.
    "cudnn-retune": ("cudnn-retune",),
    # The eighth fresh set's (mapped 2026-11-28, before any measurement; bench/jobs/fresh8_spec.py):
    # a fused Adam is unfused-optimizer's action; an EMA kept on the CPU is CPU work in the loop,
    # whose action names the function and doing tensor math on the GPU. No finding's action is
    # sparse embeddings, freezing the encoder, or turning anomaly detection off: misses until built.
    "sparse-embeddings": (),
    "frozen-encoder": (),
    # Built after the eighth set's first measurement (2026-11-28), from its held-out misses: those
    # jobs are in-sample for them from then on. The EMA's copies to the host are copies-to-host's.
    "detect-anomaly": ("anomaly-detection",),
    "ema-on-cpu": ("cpu-work-in-loop", "copies-to-host"),
    # The ninth fresh set's (mapped 2026-11-28, before any measurement; bench/jobs/fresh9_spec.py):
    # a permutation drawn on the CPU every step is CPU work in the loop, whose action names the
    # function and moving the tensor work onto the GPU. No finding's action is stopping a
    # profiler, channels_last or computing logits for the last position only: misses until built.
    "randperm-per-step": ("cpu-work-in-loop",),
    "profiler": (),
    "channels-last": (),
    "full-vocab-logits": (),
    # The tenth fresh set's (mapped 2026-11-28, before any measurement; bench/jobs/fresh10_spec.py):
    # a larger batch is launch-bound's action (as for the earlier sets' batch knobs); a per-anchor
    # Python loop vectorised is cpu-work-in-loop's ("vectorise a per-sample Python loop"). No
    # finding's action is cuDNN's fused LSTM for a Python LSTMCell loop, or cuDNN turned back on:
    # misses until built.
    # launch-bound names nn.LSTM/nn.GRU for a recurrent cell stepped from Python since the tenth
    # set's first measurement (its LSTMCell job is in-sample for it from then on).
    "python-rnn-loop": ("launch-bound",),
    "cudnn-disabled": (),
    "python-mining-loop": ("cpu-work-in-loop",),
    # The eleventh fresh set's (mapped 2026-11-28, before any measurement; bench/jobs/fresh11_spec.py):
    # a fused AdamW for an optimizer looping in Python over its tensors is unfused-optimizer's action
    # ("optimizer" above); one call per crop resolution instead of one per view is "fewer, larger
    # kernels per step", launch-bound's. No finding's action is nn.LayerNorm/nn.GELU for hand-written
    # elementwise ones, or one index operation per batch instead of per-row __getitem__ (data-starved
    # names workers, a change not measured here): misses until built.
    "view-batching": ("launch-bound",),
    # Built after the eleventh set's first measurement (2026-11-28), from its held-out misses: those
    # jobs are in-sample for them from then on. memory-bound-kernels names fused modules for a
    # user's hand-written norm/activation; workers-saturated names one index operation per batch
    # where the workers' time is the per-row fetch machinery.
    "fused-elementwise": ("memory-bound-kernels",),
    "per-row-batching": ("workers-saturated",),
    # The twelfth fresh set's (mapped 2026-11-28, before any measurement; bench/jobs/fresh12_spec.py):
    # checkpointing a model whose activations fit is activation-checkpointing's action; a bias built
    # on the CPU in the forward is CPU work in the loop, whose action names the function and moving
    # the tensor work onto the GPU. No finding's action is dropping deterministic algorithms or an
    # embedding lookup for a one-hot matmul: misses until built.
    "needless-checkpointing": ("activation-checkpointing",),
    # (Extended after its measurement: tensor-built-on-cpu, built for this class this session, names
    # the function and the change measured, making it once on the GPU.)
    "cpu-bias": ("cpu-work-in-loop", "tensor-built-on-cpu"),
    "deterministic-algorithms": (),
    "one-hot-input": (),
    # The thirteenth fresh set's (mapped 2026-11-28, before any measurement; bench/jobs/fresh13_spec.py):
    # CUDA_LAUNCH_BLOCKING left set is cuda-launch-blocking's own action. No finding's action is one
    # backward of the summed task losses, scaling a dataset once instead of per batch, or a sparse
    # adjacency product: misses until built.
    "launch-blocking": ("cuda-launch-blocking",),
    # Mapped after the first measurement (2026-11-28), for the rule built from it (in-sample now):
    # backward-per-loss's action is the one backward of the summed losses.
    "per-task-backward": ("backward-per-loss",),
    "rescale-per-batch": (),
    "dense-adjacency": (),
    # The fourteenth fresh set's (mapped 2026-11-28, before any measurement; bench/jobs/fresh14_spec.py):
    # the per-photo augmentation loop on the GPU is user code in the step whose fix is to vectorise it
    # (cpu-work-in-loop's action says so); the activation-statistics hooks on every module are user
    # code in the step whose fix is to run them every N steps (cpu-work-in-loop's, after the update).
    # No finding's action is padding a GEMM dimension or attn_implementation="sdpa": misses until built.
    "per-photo-augment": ("cpu-work-in-loop",),
    "activation-hooks": ("cpu-work-in-loop",),
    "odd-vocab": (),
    "eager-attention": (),
    "ema": (),  # the healthy job's EMA knob: a false alarm's only
}
# Truths declared, not measured: a change with this label is never run, and it is the job's truth.
DECLARED = ("stuck",)

# Every job we start on a shared multi-GPU host keeps NVLink multicast off.
JOB_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class Change:
    label: str  # the truth it makes when it pays: a key of TRUTH_FINDINGS
    text: str  # the change, as a user would write it
    args: tuple[str, ...]  # replace the same options of the job's args (or add flags)
    removes: tuple[str, ...] = ()  # flags the change removes


@dataclass(frozen=True)
class Job:
    name: str
    framework: str
    held_out: bool
    script: str
    args: tuple[str, ...]
    changes: tuple[Change, ...]  # every change measured; the best one that pays is the truth
    torchrun: bool = False
    tiny_args: tuple[str, ...] = field(default_factory=tuple)  # CPU smoke-test stand-ins
    note: str = ""  # its history, where it matters (a job moved out of the held-out set)
    fresh: bool = False  # written without reading the advisor's rules (held out too); reported apart
    attach_early: bool = False  # advise attaches at the job's "attach" line, before its warm-up ends
    ready_timeout_s: float = READY_TIMEOUT_S

    def argv(self, change: Change | None, device: str, tiny: bool) -> list[str]:
        args = list(self.args)
        if change is not None:
            args = _override([a for a in args if a not in change.removes], list(change.args))
        if tiny:
            args = _override(args, list(self.tiny_args)) + ["--tiny"]
        args += ["--device", device]
        script = os.path.join(JOBS_DIR, self.script)
        if self.torchrun:
            return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", script, *args]
        return [sys.executable, script, *args]


def _override(args: list[str], extra: list[str]) -> list[str]:
    """``extra``'s options replace the same options in ``args``."""
    out, skip = [], False
    keys = {a for a in extra if a.startswith("--")}
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in keys:
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(a)
    return out + extra


BF16 = "with torch.autocast('cuda', dtype=torch.bfloat16): around forward and loss"
FRESH = ("fresh: written without reading the advisor's rules, sized for one H100 by reasoning before any "
         "measurement")
MOVED = ("held out in the first H100 run (before any rule change), {what}; moved in-sample because "
         "{why} after that run")

JOBS: tuple[Job, ...] = (
    # ---------------------------------------------------------------- in-sample
    Job("torchvision-resnet50-fp32", "torchvision", False, "vision.py",
        ("--model", "torchvision:resnet50", "--precision", "fp32", "--workers", "8"),
        (Change("precision", BF16, ("--precision", "bf16")),), tiny_args=("--model", "cnn:")),
    Job("hf-trainer-bert-fp32", "transformers", False, "hf_trainer.py",
        ("--arch", "bert", "--batch", "64", "--workers", "2"),
        (Change("precision", "TrainingArguments(bf16=True)", ("--bf16",)),)),
    Job("hf-trainer-bert-collate", "transformers", False, "hf_trainer.py",
        ("--arch", "bert", "--bf16", "--batch", "64", "--workers", "0", "--collate-ms", "40"),
        (Change("data", "TrainingArguments(dataloader_num_workers=8)", ("--workers", "8")),)),
    Job("lightning-resnet18-fp32", "lightning", False, "lightning_job.py",
        ("--model", "torchvision:resnet18", "--precision", "32-true", "--batch", "256", "--workers", "8"),
        (Change("precision", "Trainer(precision='bf16-mixed')", ("--precision", "bf16-mixed")),),
        tiny_args=("--model", "cnn:")),
    Job("accelerate-frames-pageable", "accelerate", False, "accelerate_job.py",
        ("--task", "frames", "--batch", "32", "--workers", "4"),
        (Change("pageable", "DataLoader(pin_memory=True) + DataLoaderConfiguration(non_blocking=True)", ("--pin",)),)),
    Job("compile-gpt-bf16", "torch.compile", False, "gpt.py", ("--compile", "--batch", "16"),
        (Change("launch", "torch.optim.AdamW(..., fused=True) (the knob a false alarm would name)", ("--fused",)),)),
    Job("ddp-resnet50-augment", "DDP", False, "vision.py",
        ("--model", "torchvision:resnet50", "--precision", "bf16", "--workers", "3", "--augment", "--channels-last"),
        (Change("data", "DataLoader(num_workers=14)", ("--workers", "14")),), torchrun=True,
        tiny_args=("--model", "cnn:")),
    Job("timm-vit-b16-fp32", "timm", False, "vision.py",
        ("--model", "timm:vit_base_patch16_224", "--precision", "fp32", "--batch", "64", "--workers", "8",
         "--optimizer", "adamw"),
        (Change("precision", BF16, ("--precision", "bf16")),), tiny_args=("--model", "cnn:"),
        note=MOVED.format(what="missed (no finding: its conv stem's TF32 work kept the tensor cores above the "
                               "'idle' bar)", why="the fp32-pipe rule was changed")),
    Job("hf-trainer-gpt2-bf16", "transformers", False, "hf_trainer.py",
        ("--arch", "gpt2", "--bf16", "--batch", "16", "--seq", "512", "--workers", "2"),
        (Change("data", "TrainingArguments(dataloader_num_workers=8) (the knob a false alarm would name)", ("--workers", "8")),
         Change("launch", "per_device_train_batch_size=64 instead of 16 (samples/s)", ("--batch", "64"))),
        note=MOVED.format(what="called launch-bound while its only measured change was more workers",
                          why="the change launch-bound names (a larger batch) was added to its measurements")),
    Job("lightning-lm-item-sync", "lightning", False, "lightning_job.py",
        ("--model", "lm", "--precision", "bf16-mixed", "--batch", "32", "--workers", "2", "--item-sync"),
        (Change("host-sync", "drop the per-step loss.item() from training_step", (), removes=("--item-sync",)),
         Change("launch", "batch 128 instead of 32 (samples/s)", ("--batch", "128"))),
        note=MOVED.format(what="called launch-bound while its only measured change was dropping the .item()",
                          why="the change launch-bound names (a larger batch) was added to its measurements")),
    # written with the unfused-optimizer rule (in-sample): AdamW(foreach=False), as codebases set
    # it for determinism or memory, on a small-batch GPT-2 whose step launches more than it computes
    Job("plain-gpt-adamw-loop", "pytorch", False, "gpt.py", ("--batch", "4", "--seq", "128", "--foreach-off"),
        (Change("optimizer", "torch.optim.AdamW(..., fused=True)", ("--fused",), removes=("--foreach-off",)),
         Change("launch", "batch 32 instead of 4 (samples/s)", ("--batch", "32")))),
    # ---------------------------------------------------------------- held out
    Job("lightning-resnet50-bf16-augment", "lightning", True, "lightning_job.py",
        ("--model", "torchvision:resnet50", "--precision", "bf16-mixed", "--batch", "128", "--workers", "2",
         "--augment"),
        (Change("data", "DataLoader(num_workers=14)", ("--workers", "14")),), tiny_args=("--model", "cnn:")),
    Job("plain-gpt-checkpoint", "pytorch", True, "gpt.py", ("--batch", "8", "--ckpt-every", "20"),
        (Change("checkpoint", "checkpoint every 200 steps instead of 20 (or torch.distributed.checkpoint.async_save)",
                ("--ckpt-every", "200")),)),
    Job("accelerate-mlp-small-batch", "accelerate", True, "accelerate_job.py",
        ("--task", "mlp", "--mixed-precision", "no", "--batch", "64", "--workers", "0"),
        (Change("launch", "batch 512 instead of 64 (samples/s)", ("--batch", "512")),)),
    # written after the first H100 run and its rule changes, run without any change made for them
    Job("timm-convnext-bf16-augment", "timm", True, "vision.py",
        ("--model", "timm:convnext_tiny", "--precision", "bf16", "--batch", "128", "--workers", "4", "--augment",
         "--channels-last", "--optimizer", "adamw"),
        (Change("data", "DataLoader(num_workers=14)", ("--workers", "14")),), tiny_args=("--model", "cnn:")),
    Job("hf-trainer-gpt2-fp32", "transformers", True, "hf_trainer.py",
        ("--arch", "gpt2", "--batch", "8", "--seq", "512", "--workers", "2"),
        (Change("precision", "TrainingArguments(bf16=True)", ("--bf16",)),)),
    Job("lightning-resnet18-bf16", "lightning", True, "lightning_job.py",
        ("--model", "torchvision:resnet18", "--precision", "bf16-mixed", "--batch", "256", "--workers", "12"),
        (Change("data", "DataLoader(num_workers=16) (the knob a false alarm would name)", ("--workers", "16")),),
        tiny_args=("--model", "cnn:")),
    Job("plain-gpt-sync-every-step", "pytorch", True, "gpt.py", ("--batch", "16", "--sync-every-step"),
        (Change("host-sync", "drop the per-step torch.cuda.synchronize() and loss.item()", (),
                removes=("--sync-every-step",)),)),
    Job("accelerate-vit-fp32", "accelerate", True, "accelerate_job.py",
        ("--task", "vit", "--mixed-precision", "no", "--batch", "128", "--workers", "6"),
        (Change("precision", "Accelerator(mixed_precision='bf16')", ("--mixed-precision", "bf16")),)),
    # written in the shapes of public example scripts without reading the advisor's rules, before
    # any measurement of them; each change is what an engineer would try on that script
    Job("hf-trainer-bert-small-accum-fp32", "transformers", True, "hf_glue.py",
        ("--batch", "32", "--grad-accum", "4", "--workers", "0"),
        (Change("precision", "TrainingArguments(bf16=True)", ("--bf16",)),
         Change("data", "TrainingArguments(dataloader_num_workers=4)", ("--workers", "4")))),
    Job("lightning-audio-mel-bf16", "lightning", True, "lightning_audio.py",
        ("--precision", "bf16-mixed", "--batch", "256", "--workers", "2"),
        (Change("data", "DataLoader(num_workers=14) in the LightningDataModule", ("--workers", "14")),)),
    Job("accelerate-llama-clm-accum-bf16", "accelerate", True, "accelerate_clm.py",
        ("--mixed-precision", "bf16", "--batch", "8", "--grad-accum", "4", "--workers", "0"),
        (Change("data", "DataLoader(num_workers=4) (the knob a false alarm would name)", ("--workers", "4")),
         Change("launch", "per_device_train_batch_size=32 with gradient_accumulation_steps=1, the same effective "
                "batch (samples/s; the knob a false alarm would name)", ("--batch", "32", "--grad-accum", "1")))),
    Job("plain-probe-pageable-features", "pytorch", True, "features_probe.py", ("--batch", "4096"),
        (Change("pageable", "feats.pin_memory() once, then .to(device, non_blocking=True)", ("--pin",)),
         Change("precision", BF16, ("--precision", "bf16")))),
    Job("ddp-cifar-resnet18-loss-allreduce", "DDP", True, "ddp_cifar.py", ("--batch", "128", "--workers", "4"),
        (Change("host-sync", "all_reduce and .item() the loss every 50 steps instead of every step",
                ("--log-every", "50")),
         Change("launch", "batch 512 per GPU instead of 128 (samples/s)", ("--batch", "512")),
         Change("data", "DataLoader(num_workers=8, persistent_workers=True)", ("--workers", "8", "--persistent-workers"))),
        torchrun=True),
    # ---------------------------------------------------------------- written fresh, held out: never tuned on
    # Written without reading how the advisor decides anything, each with one problem a user hits and the
    # change an engineer would make for it (or, for a control, the knobs a false alarm would name).
    Job("fresh-resnet50-cpu-augment-in-loop", "torchvision", True, "fresh_cpu_augment.py",
        ("--batch", "64", "--workers", "4"),
        (Change("cpu-in-loop", "do the batch augmentation (crop/resize, flip, jitter, noise) after x.to(device), "
                "on the GPU", ("--gpu-augment",)),),
        fresh=True, note=FRESH),
    Job("fresh-bert-gpu-hang", "transformers", True, "fresh_gpu_hang.py",
        ("--batch", "32", "--seq", "256", "--hang-after-s", "6"),
        (Change("stuck", "none: a kernel that never finishes; the job is stuck (find the hang, restart)", ()),),
        fresh=True, note=FRESH),
    Job("fresh-compile-gpt2-attached-while-compiling", "torch.compile", True, "fresh_compile_gpt2.py",
        ("--batch", "16", "--seq", "1024", "--workers", "2"),
        (Change("optimizer", "torch.optim.AdamW(..., fused=True) (the knob a false alarm would name)", ("--fused",)),
         Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8"))),
        fresh=True, attach_early=True, ready_timeout_s=600.0, note=FRESH),
    Job("fresh-ctr-workers-respawn-each-epoch", "pytorch", True, "fresh_workers_respawn.py",
        ("--batch", "1024", "--batches-per-epoch", "8", "--workers", "4"),
        (Change("workers-respawn", "DataLoader(persistent_workers=True)", ("--persistent-workers",)),
         Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8"))),
        fresh=True, note=FRESH),
    Job("fresh-bert-empty-cache-every-step", "transformers", True, "fresh_empty_cache.py",
        ("--batch", "32", "--seq", "256"),
        (Change("empty-cache", "remove the per-step torch.cuda.empty_cache()", ("--keep-cache",)),
         # Added after the first measurement, which showed launch-bound for a while: the change it
         # names, measured, so its truth is whichever pays more (the truth procedure, not a rule).
         Change("launch", "batch 128 instead of 32 (samples/s; the change launch-bound names)", ("--batch", "128"))),
        fresh=True, note=FRESH),
    Job("fresh-timm-convnext-small-fp32", "timm", True, "fresh_timm_fp32.py", ("--batch", "128", "--workers", "10"),
        (Change("precision", BF16, ("--amp",)),), fresh=True, note=FRESH),
    Job("fresh-roberta-micro-batch-4-accum-16", "transformers", True, "fresh_grad_accum.py",
        ("--micro-batch", "4", "--accum", "16", "--seq", "256", "--workers", "2"),
        (Change("launch", "micro-batch 64 with 1 accumulation step instead of 4 x 16: the same effective batch "
                "(samples/s)", ("--micro-batch", "64", "--accum", "1")),),
        fresh=True, note=FRESH),
    Job("fresh-gpt2-log-everything-every-step", "transformers", True, "fresh_logging_heavy.py",
        ("--batch", "8", "--seq", "256", "--log-every", "1"),
        (Change("host-sync", "log (tqdm postfix, metrics dict and its .item()s) every 50 steps instead of every step",
                ("--log-every", "50")),
         # Added after the first measurement, which named launch-bound: its change measured too.
         Change("launch", "batch 64 instead of 8 (samples/s; the change launch-bound names)", ("--batch", "64"))),
        fresh=True, note=FRESH),
    Job("fresh-resnet50-bf16-healthy", "torchvision", True, "fresh_healthy_resnet.py",
        ("--batch", "256", "--workers", "12"),
        (Change("data", "DataLoader(num_workers=16) (the knob a false alarm would name)", ("--workers", "16")),
         Change("launch", "batch 512 instead of 256 (samples/s; the knob a false alarm would name)", ("--batch", "512"))),
        fresh=True, note=FRESH),
    Job("fresh-resnet50-jpeg-decode-no-workers", "torchvision", True, "fresh_decode_getitem.py",
        ("--batch", "128", "--workers", "0"),
        (Change("data", "DataLoader(num_workers=8)", ("--workers", "8")),), fresh=True, note=FRESH),
    # The fifth fresh set: written by a helper that read none of the advisor, its truths and gains
    # reasoned before any measurement (bench/jobs/fresh5_spec.py); labels mapped to findings here.
    Job("fresh5-torch-manual-attention", "torch", True, "fresh5_manual_attention.py", ("--batch", "8", "--context", "2048"),
        (Change("attention", "F.scaled_dot_product_attention(q, k, v, is_causal=True) instead of the hand-written "
                "attention (q @ k^T, masked_fill, softmax, @ v)", ("--sdpa",)),), fresh=True, note=FRESH),
    Job("fresh5-transformers-loop-loss", "transformers", True, "fresh5_loop_loss.py", ("--batch", "256", "--max-length", "64"),
        (Change("host-sync", "one masked cross-entropy for the batch instead of a Python loop over its sentences that "
                "reads each length with int(mask[i].sum())", ("--vectorized-loss",)),), fresh=True, note=FRESH),
    Job("fresh5-accelerate-save-state", "accelerate", True, "fresh5_save_state.py",
        ("--batch", "8", "--context", "1024", "--save-every", "50"),
        (Change("checkpoint", "accelerator.save_state() every 2,000 steps instead of every 50", ("--save-every", "2000")),),
        fresh=True, note=FRESH),
    Job("fresh5-lightning-healthy-llama", "lightning", True, "fresh5_healthy_lightning.py",
        ("--batch", "8", "--context", "1024", "--workers", "4"),
        (Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8")),
         Change("launch", "batch 16 instead of 8 (samples/s; the knob a false alarm would name)", ("--batch", "16"))),
        fresh=True, note=FRESH),
    # The sixth fresh set, written likewise (bench/jobs/fresh6_spec.py, truths and gains reasoned
    # before any measurement).
    Job("fresh6-torch-float64-model", "torch", True, "fresh6_float64.py", ("--batch", "128"),
        (Change("float64", "model and data in float32 (autocast then runs the matmuls in bf16) instead of "
                "model.double() on float64 data", ("--float32",)),), fresh=True, note=FRESH),
    Job("fresh6-transformers-pad-max-length", "transformers", True, "fresh6_pad_max_length.py",
        ("--batch", "32", "--max-length", "512"),
        (Change("padding", "pad each batch to its longest example (a multiple of 8, grouped by length) instead of "
                "padding='max_length' to 512", ("--dynamic-padding",)),
         # Added after the first measurement: the change its launch-bound warning named, measured so that
         # the warning is judged by what it promised (2.6x), not by the author's truth alone.
         Change("launch", "batch 64 instead of 32 (samples/s; the change the launch-bound warning named)",
                ("--batch", "64"))), fresh=True, note=FRESH),
    Job("fresh6-lightning-cudnn-benchmark", "lightning", True, "fresh6_cudnn_benchmark.py",
        ("--batch", "32", "--workers", "6"),
        (Change("cudnn-retune", "pad each clip to a multiple of 16,000 samples so cudnn.benchmark sees few input "
                "lengths", ("--pad-multiple", "16000")),
         Change("cudnn-retune", "Trainer(benchmark=False)", ("--no-benchmark",))), fresh=True, note=FRESH),
    Job("fresh6-accelerate-cpu-metrics", "accelerate", True, "fresh6_cpu_metrics.py",
        ("--batch", "8", "--context", "1024"),
        (Change("metrics-on-cpu", "token accuracy on the GPU (argmax there, one number to the host) instead of the "
                "full logits copied to the CPU and argmax'ed in numpy every step", ("--gpu-metrics",)),),
        fresh=True, note=FRESH),
    Job("fresh6-torch-healthy-gpt", "torch", True, "fresh6_healthy_gpt.py",
        ("--batch", "4", "--context", "2048", "--workers", "4"),
        (Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8")),
         Change("launch", "batch 8 instead of 4 (samples/s; the knob a false alarm would name)", ("--batch", "8")),
         Change("launch", "torch.compile(model) (the knob a false alarm would name)", ("--compile",))),
        fresh=True, note=FRESH),
    # The eighth fresh set, written 2026-11-28 by a helper that read no rule and no result (its
    # truths and gains reasoned in bench/jobs/fresh8_spec.py before any measurement).
    Job("fresh8-torch-dlrm-dense-adam", "torch", True, "fresh8_dlrm_dense_adam.py", ("--batch", "8192"),
        (Change("sparse-embeddings", "nn.Embedding(sparse=True) tables trained with torch.optim.SparseAdam (the dense "
                "layers keep Adam) instead of one dense Adam over every embedding row each step", ("--sparse",)),
         Change("optimizer", "Adam(fused=True) over the same dense update (a partial fix)", ("--fused-adam",))),
        fresh=True, note=FRESH),
    Job("fresh8-transformers-unfrozen-encoder", "transformers", True, "fresh8_unfrozen_encoder.py",
        ("--batch", "64", "--seq-len", "256"),
        (Change("frozen-encoder", "model.bert.requires_grad_(False): no backward through an encoder the head-only "
                "optimizer never updates", ("--freeze-encoder",)),), fresh=True, note=FRESH),
    Job("fresh8-lightning-detect-anomaly", "lightning", True, "fresh8_detect_anomaly.py",
        ("--batch", "16", "--context", "1024", "--workers", "4"),
        (Change("detect-anomaly", "Trainer(detect_anomaly=False) (the default) instead of anomaly detection left on",
                ("--no-detect-anomaly",)),), fresh=True, note=FRESH),
    Job("fresh8-timm-ema-cpu", "timm", True, "fresh8_ema_cpu.py", ("--batch", "128", "--workers", "8"),
        (Change("ema-on-cpu", "ModelEmaV3(model, decay) on the GPU instead of device='cpu' (every step copied the "
                "weights to the host and averaged them there)", ("--ema-on-gpu",)),), fresh=True, note=FRESH),
    Job("fresh8-accelerate-healthy-lm", "accelerate", True, "fresh8_healthy_accelerate.py",
        ("--batch", "4", "--context", "2048", "--workers", "4"),
        (Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8")),
         Change("launch", "batch 8 instead of 4 (samples/s; the knob a false alarm would name)", ("--batch", "8")),
         Change("launch", "torch.compile(model) (the knob a false alarm would name)", ("--compile",))),
        fresh=True, note=FRESH),
    # The ninth fresh set, written 2026-11-28 by a helper that read no rule and no result (its
    # truths and gains reasoned in bench/jobs/fresh9_spec.py before any measurement).
    Job("fresh9-torch-randperm-per-step", "torch", True, "fresh9_randperm_sampler.py", ("--batch", "1024"),
        (Change("randperm-per-step", "one permutation per epoch, drawn on the GPU, sliced into batches, instead of "
                "a 2.5M-element torch.randperm on the CPU every step", ("--epoch-permutation",)),),
        fresh=True, note=FRESH),
    Job("fresh9-torch-profiler-cycles", "torch", True, "fresh9_profiler_cycles.py",
        ("--batch", "48", "--workers", "6"),
        (Change("profiler", "the profiler schedule with repeat=1 (one cycle, then stop) instead of cycling for ever",
                ("--profile-cycles", "1")),
         Change("profiler", "no profiler around the loop", ("--no-profile",))), fresh=True, note=FRESH),
    Job("fresh9-timm-nchw-amp", "timm", True, "fresh9_timm_nchw.py", ("--batch", "256", "--workers", "10"),
        (Change("channels-last", "model and batches in channels_last (NHWC) under the same bf16 autocast",
                ("--channels-last",)),), fresh=True, note=FRESH),
    Job("fresh9-transformers-full-vocab-logits", "transformers", True, "fresh9_full_vocab_logits.py",
        ("--batch", "32", "--seq-len", "256"),
        (Change("full-vocab-logits", "the model called with logits_to_keep=1: the LM head and the log-softmax on the "
                "last position only", ("--logits-to-keep", "1")),), fresh=True, note=FRESH),
    Job("fresh9-lightning-healthy-protein-mlm", "lightning", True, "fresh9_healthy_protein_mlm.py",
        ("--batch", "8", "--context", "1024", "--workers", "4"),
        (Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8")),
         Change("launch", "batch 16 instead of 8 (samples/s; the knob a false alarm would name)", ("--batch", "16")),
         Change("launch", "torch.compile (the knob a false alarm would name)", ("--compile",))),
        fresh=True, note=FRESH),
    # The tenth fresh set, written 2026-11-28 by a helper that read no rule and no result (its
    # truths and gains reasoned in bench/jobs/fresh10_spec.py before any measurement).
    Job("fresh10-transformers-trainer-default-batch", "transformers", True, "fresh10_hf_default_batch.py", (),
        (Change("launch", "per_device_train_batch_size=128 instead of the Trainer's default 8", ("--batch", "128")),),
        fresh=True, note=FRESH),
    Job("fresh10-lightning-lstmcell-loop", "lightning", True, "fresh10_lightning_lstm_cells.py",
        ("--batch", "512", "--workers", "4"),
        (Change("python-rnn-loop", "a 2-layer nn.LSTM (cuDNN) instead of nn.LSTMCell stepped in Python",
                ("--cudnn-lstm",)),), fresh=True, note=FRESH),
    Job("fresh10-timm-cudnn-disabled", "timm", True, "fresh10_timm_cudnn_off.py", ("--batch", "256", "--workers", "8"),
        (Change("cudnn-disabled", "keep cuDNN on (drop torch.backends.cudnn.enabled = False from the seeding helper)",
                ("--keep-cudnn",)),), fresh=True, note=FRESH),
    Job("fresh10-torch-triplet-anchor-loop", "torch", True, "fresh10_triplet_anchor_loop.py",
        ("--speakers-per-batch", "64", "--utts-per-speaker", "4", "--workers", "6"),
        (Change("python-mining-loop", "batch-hard mining vectorised over the whole distance matrix instead of a Python "
                "loop over the anchors with boolean-mask indexing", ("--vectorized-mining",)),),
        fresh=True, note=FRESH),
    Job("fresh10-torch-healthy-parallel-gpt", "torch", True, "fresh10_healthy_parallel_gpt.py",
        ("--micro-batch", "4", "--accum", "8", "--workers", "2"),
        (Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8")),
         Change("launch", "micro-batch 8 instead of 4 (samples/s; the knob a false alarm would name)",
                ("--micro-batch", "8")),
         Change("launch", "torch.compile (the knob a false alarm would name)", ("--compile",))),
        fresh=True, note=FRESH),
    # The eleventh fresh set, written 2026-11-28 by a helper that read no rule and no result (its
    # truths and gains reasoned in bench/jobs/fresh11_spec.py before any measurement).
    Job("fresh11-transformers-t5-hf-adafactor", "transformers", True, "fresh11_hf_t5_adafactor.py", (),
        (Change("optimizer", "optim='adamw_torch_fused' instead of transformers' Adafactor (a per-tensor Python loop)",
                ("--optim", "adamw_torch_fused")),), fresh=True, note=FRESH),
    Job("fresh11-timm-dino-per-view-forward", "timm", True, "fresh11_timm_dino_view_loop.py",
        ("--batch", "32", "--workers", "4"),
        (Change("view-batching", "one student/teacher call per crop resolution (views concatenated) instead of one "
                "per view", ("--batch-views",)),), fresh=True, note=FRESH),
    Job("fresh11-torch-gpt-handwritten-layernorm-gelu", "torch", True, "fresh11_torch_gpt_handwritten_norm.py",
        ("--batch", "16"),
        (Change("fused-elementwise", "nn.LayerNorm and nn.GELU(approximate='tanh') instead of hand-written "
                "elementwise ones", ("--fused-ops",)),), fresh=True, note=FRESH),
    Job("fresh11-lightning-tabular-per-row-collate", "lightning", True, "fresh11_lightning_tabular_rows.py",
        ("--batch", "8192", "--workers", "4"),
        (Change("per-row-batching", "a BatchSampler as the sampler (batch_size=None): one index operation per "
                "batch instead of 8,192 __getitem__ calls", ("--batched-sampler",)),), fresh=True, note=FRESH),
    Job("fresh11-torch-healthy-long-context-lm", "torch", True, "fresh11_healthy_long_context_lm.py",
        ("--micro-batch", "4", "--accum", "4", "--workers", "2"),
        (Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8")),
         Change("launch", "torch.compile (the knob a false alarm would name)", ("--compile",)),
         Change("launch", "8 accumulation steps instead of 4 (the knob a false alarm would name)", ("--accum", "8"))),
        fresh=True, note=FRESH),
    # The twelfth fresh set, written 2026-11-28 by a helper that read no rule and no result (its
    # truths and gains reasoned in bench/jobs/fresh12_spec.py before any measurement; plain PyTorch).
    Job("fresh12-torch-meshgraphnet-deterministic-algorithms", "torch", True,
        "fresh12_torch_meshgraphnet_deterministic.py", (),
        (Change("deterministic-algorithms", "no torch.use_deterministic_algorithms(True): index_add_ takes its atomic "
                "path", ("--no-deterministic",)),), fresh=True, note=FRESH),
    Job("fresh12-torch-vit-needless-grad-checkpointing", "torch", True, "fresh12_torch_vit_grad_checkpointing.py",
        ("--batch", "192"),
        (Change("needless-checkpointing", "gradient checkpointing off (the activations fit easily)",
                ("--no-grad-checkpointing",)),), fresh=True, note=FRESH),
    Job("fresh12-torch-sasrec-one-hot-item-input", "torch", True, "fresh12_torch_sasrec_onehot_items.py",
        ("--batch", "256"),
        (Change("one-hot-input", "nn.Embedding lookup instead of a one-hot matrix times a Linear", ("--embedding",)),),
        fresh=True, note=FRESH),
    Job("fresh12-torch-alibi-bias-built-on-cpu", "torch", True, "fresh12_torch_dna_alibi_cpu_bias.py",
        ("--batch", "16"),
        (Change("cpu-bias", "the ALiBi bias built once on the GPU and sliced, instead of on the CPU in every "
                "layer's forward", ("--cached-bias",)),), fresh=True, note=FRESH),
    Job("fresh12-torch-healthy-clip-vit-large", "torch", True, "fresh12_healthy_clip_vitl.py",
        ("--batch", "128", "--workers", "6"),
        (Change("data", "DataLoader(num_workers=12) (the knob a false alarm would name)", ("--workers", "12")),
         Change("launch", "batch 192 instead of 128 (samples/s; the knob a false alarm would name)",
                ("--batch", "192"))),
        fresh=True, note=FRESH),
    # The thirteenth fresh set, written 2026-11-28 by a helper that read no rule and no result (its
    # truths and gains reasoned in bench/jobs/fresh13_spec.py before any measurement).
    Job("fresh13-torchvision-multitask-backward-per-task", "torchvision", True,
        "fresh13_tv_multitask_per_task_backward.py", ("--batch", "16"),
        (Change("per-task-backward", "one backward of the summed task losses instead of one retain_graph backward "
                "per task", ("--single-backward",)),), fresh=True, note=FRESH),
    Job("fresh13-torch-patchtst-whole-series-rescaled-per-batch", "torch", True,
        "fresh13_torch_sensor_forecast_rescale.py", ("--batch", "2048"),
        (Change("rescale-per-batch", "the readings z-scored once at start instead of the whole matrix per batch",
                ("--scale-once",)),), fresh=True, note=FRESH),
    Job("fresh13-hf-roberta-cuda-launch-blocking", "transformers", True, "fresh13_hf_roberta_launch_blocking.py",
        ("--batch", "32"),
        (Change("launch-blocking", "CUDA_LAUNCH_BLOCKING no longer set in the script", ("--no-launch-blocking",)),),
        fresh=True, note=FRESH),
    Job("fresh13-torch-gcn-dense-adjacency", "torch", True, "fresh13_torch_gcn_dense_adjacency.py",
        ("--nodes", "40000"),
        (Change("dense-adjacency", "the propagation matrix sparse (torch.sparse.mm) instead of dense",
                ("--sparse-adjacency",)),), fresh=True, note=FRESH),
    Job("fresh13-lightning-healthy-timm-convnext", "lightning", True, "fresh13_healthy_lightning_convnext.py",
        ("--batch", "256", "--workers", "8"),
        (Change("data", "DataLoader(num_workers=12) (the knob a false alarm would name)", ("--workers", "12")),
         Change("launch", "batch 384 instead of 256 (samples/s; the knob a false alarm would name)",
                ("--batch", "384"))),
        fresh=True, note=FRESH),
    # The fourteenth fresh set, written 2026-11-28 by a helper that read no rule and no result (its
    # truths and gains reasoned in bench/jobs/fresh14_spec.py, the problems' cores timed with stand-ins).
    Job("fresh14-torch-gpt2-unpadded-vocab-50257", "torch", True, "fresh14_torch_gpt_odd_vocab.py", ("--batch", "32"),
        (Change("odd-vocab", "the vocabulary padded from 50,257 to 50,304 (a multiple of 64)", ("--pad-vocab",)),),
        fresh=True, note=FRESH),
    Job("fresh14-hf-llama-eager-attention", "transformers", True, "fresh14_hf_llama_eager_attention.py",
        ("--batch", "6"),
        (Change("eager-attention", 'attn_implementation="sdpa" instead of "eager"',
                ("--attn-implementation", "sdpa")),), fresh=True, note=FRESH),
    Job("fresh14-timm-vit-activation-stat-hooks", "timm", True, "fresh14_timm_vit_activation_hooks.py",
        ("--batch", "256", "--workers", "8"),
        (Change("activation-hooks", "the activation-statistics hooks every 100 steps instead of every step",
                ("--stats-every", "100")),), fresh=True, note=FRESH),
    Job("fresh14-lightning-resnet50-per-photo-gpu-augment", "lightning", True, "fresh14_lightning_per_image_augment.py",
        ("--batch", "256", "--workers", "8"),
        (Change("per-photo-augment", "the GPU augmentation applied to the whole batch at once instead of photo by photo",
                ("--batched-augment",)),), fresh=True, note=FRESH),
    Job("fresh14-torch-healthy-dit-b2-latents", "torch", True, "fresh14_healthy_dit_latents.py",
        ("--batch", "256", "--workers", "4"),
        (Change("data", "DataLoader(num_workers=8) (the knob a false alarm would name)", ("--workers", "8")),
         Change("launch", "batch 512 instead of 256 (samples/s; the knob a false alarm would name)",
                ("--batch", "512")),
         Change("ema", "the EMA updated every 10 steps (the knob a false alarm would name)", ("--ema-every", "10"))),
        fresh=True, note=FRESH),
    Job("fresh-vit-validate-every-step", "transformers", True, "fresh_eval_every_step.py",
        ("--batch", "128", "--val-batch", "256", "--val-every", "1"),
        (Change("eval-every-step", "validate every 200 steps instead of after every training step",
                ("--val-every", "200")),), fresh=True, note=FRESH),
)


# ------------------------------------------------------------------------------- running a job


class Running:
    """A started job: its progress lines read by a thread."""

    def __init__(self, argv: list[str], log_path: str) -> None:
        env = dict(os.environ, **JOB_ENV, PYTHONPATH=JOBS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
                                     start_new_session=True, cwd=JOBS_DIR)
        self.started = time.time()
        self.rates: list[tuple[float, int]] = []  # (t, samples)
        self.ready = threading.Event()
        self.attach = threading.Event()  # an attach_early job's "attach here" line
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if parts[:2] == ["gputop-workload", "ready"]:
                self.ready.set()
            elif parts[:2] == ["gputop-workload", "attach"]:
                self.attach.set()
            elif parts[:2] == ["gputop-workload", "rate"]:
                kv = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
                self.rates.append((float(kv["t"]), int(kv["samples"])))
            else:
                self.log.write(line)

    def rate_between(self, t0: float, t1: float) -> float | None:
        pts = [(t, n) for t, n in self.rates if t0 <= t <= t1]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return None
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


class GpmProbe:
    """Every GPM metric the GPU has, averaged over a window: the signals a rule could use."""

    IDS = {"sm": 2, "occupancy": 3, "integer": 4, "tensor_any": 5, "tensor_dfma": 6, "tensor_hmma": 7,
           "tensor_imma": 9, "dram_bw": 10, "fp64": 11, "fp32": 12, "fp16": 13}

    def __init__(self) -> None:
        self.ok = False
        try:
            import pynvml as nv

            nv.nvmlInit()
            self.nv = nv
            self.h = nv.nvmlDeviceGetHandleByIndex(0)
            if not nv.nvmlGpmQueryDeviceSupport(self.h).isSupportedDevice:
                return
            self.samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            self.ok = True
        except Exception:
            pass

    def util(self) -> float | None:
        try:
            return float(self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu)
        except Exception:
            return None

    def window(self, seconds: float, every: float = 0.5) -> dict:
        if not self.ok:
            return {}
        nv = self.nv
        sums: dict[str, list[float]] = {k: [] for k in self.IDS}
        sums["util"] = []
        end = time.time() + seconds
        nv.nvmlGpmSampleGet(self.h, self.samples[0])
        cur = 0
        while time.time() < end:
            time.sleep(every)
            nv.nvmlGpmSampleGet(self.h, self.samples[cur ^ 1])
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(self.IDS)
            for i, mid in enumerate(self.IDS.values()):
                req.metrics[i].metricId = mid
            req.sample1, req.sample2 = self.samples[cur], self.samples[cur ^ 1]
            cur ^= 1
            try:
                nv.nvmlGpmMetricsGet(req)
            except Exception:
                continue
            for i, k in enumerate(self.IDS):
                if req.metrics[i].nvmlReturn == 0:
                    sums[k].append(float(req.metrics[i].value))
            u = self.util()
            if u is not None:
                sums["util"].append(u)
        return {k: round(statistics.fmean(v), 2) for k, v in sums.items() if v}


def wait_ready(job: Running, timeout: float, event: threading.Event | None = None) -> bool:
    """Until the job's ready line (or ``event``), unless it exits first."""
    event = job.ready if event is None else event
    end = time.time() + timeout
    while time.time() < end:
        if event.wait(0.5):
            return True
        if job.proc.poll() is not None:
            return False
    return False


def measure(job: Running, seconds: float, gpm: GpmProbe | None) -> tuple[float | None, dict]:
    t0 = time.time()
    metrics = gpm.window(seconds) if gpm is not None else {}
    while time.time() < t0 + seconds:
        time.sleep(0.1)
    time.sleep(0.6)  # the rate line after the window
    return job.rate_between(t0, time.time()), metrics


# Set by --record-dir: each advise session kept as DIR/JOB.gputop, so a miss is replayed through
# the advisor afterwards rather than guessed at.
RECORD_DIR: str | None = None


def advise(pid: int, duration: float, name: str = "job") -> tuple[dict | None, float, str]:
    cmd = [sys.executable, "-m", "gputop", "advise", "--pid", str(pid), "--duration", f"{duration:g}", "--json"]
    if RECORD_DIR:
        cmd += ["--record", os.path.join(RECORD_DIR, f"{name}.gputop")]
    launched = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 90, cwd=ROOT)
    try:
        return json.loads(proc.stdout), launched, ""
    except json.JSONDecodeError:
        return None, launched, f"rc={proc.returncode} {proc.stderr.strip()[-300:]}"


def dump_stacks(pid: int, path: str) -> None:
    """One py-spy dump of the job's processes as they ran: the stacks its verdict came from."""
    import psutil

    pyspy = os.environ.get("GPUTOP_PYSPY", "py-spy")
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    with open(path, "w") as f:
        for pr in procs[:6]:
            try:
                out = subprocess.run([pyspy, "dump", "--pid", str(pr.pid)], capture_output=True, text=True, timeout=20)
                f.write(f"### pid {pr.pid} {' '.join(pr.cmdline())[:200]}\n{out.stdout}{out.stderr}\n")
            except Exception as exc:
                f.write(f"### pid {pr.pid}: {exc!r}\n")


def right_at(timeline: list[dict], ok: tuple[str, ...], t: float, healthy: bool) -> bool:
    """Whether the top finding standing ``t`` s after attaching is right: for a healthy job, no
    warning standing then. A truth no finding names (``ok`` empty, not healthy) is never right:
    silence on a 3.86x job is a miss, which an empty ``ok`` alone once counted as right."""
    standing = [e for e in timeline if e.get("t_s", 0.0) <= t + 0.05]
    top = standing[-1] if standing else {}
    if top.get("severity") not in BLOCKING:
        return healthy
    return top.get("top") in ok


def judge(truth: str, report: dict | None) -> dict:
    """The verdict against the truth: the final top blocking finding, and when it first was right."""
    if report is None:
        return {"correct": False, "top_finding": None, "t_correct_s": None}
    findings = report.get("findings", [])
    blocking = [f for f in findings if f["severity"] in BLOCKING]
    timeline = report.get("top_timeline", [])
    out: dict = {
        "top_finding": blocking[0]["id"] if blocking else None,
        "top_action": blocking[0]["action"] if blocking else None,
        "top_evidence": blocking[0]["evidence"] if blocking else [],
        "top_gain_predicted": blocking[0].get("gain_predicted") if blocking else None,
        "findings": [f"{f['id']} ({f['severity']})" for f in findings],
        "timeline": timeline,
        "sampling_cost": report.get("sampling_cost"),
    }
    ok = () if truth == "healthy" else TRUTH_FINDINGS[truth]
    # A wrong warning shown for any time is a false warning: each distinct wrong top is counted.
    out["false_warnings"] = sorted({e["top"] for e in timeline if e.get("severity") in BLOCKING and e["top"] not in ok})
    out["right_at_5s"] = right_at(timeline, ok, 5.0, truth == "healthy")
    if truth == "healthy":
        ever = sorted({e["top"] for e in timeline if e.get("severity") in BLOCKING})
        out["correct"] = not blocking and not ever
        out["warned_on_the_way"] = ever
        out["t_correct_s"] = None
        return out
    out["correct"] = out["top_finding"] in ok
    first = next((e["t_s"] for e in timeline if e.get("top") in ok and e.get("severity") in BLOCKING), None)
    out["t_correct_s"] = first if out["correct"] else None
    # when the right rule first fired, before it held long enough to show
    fired = [t for fid, t in (report.get("first_fired_s") or {}).items() if fid in ok]
    out["t_fired_s"] = min(fired) if fired and out["correct"] else None
    return out


def run_job(job: Job, device: str, tiny: bool, logs: str, gains: dict | None, gpm: GpmProbe | None,
            measure_s: float = MEASURE_S, advise_s: float = ADVISE_S) -> dict:
    report = None
    row: dict = {"name": job.name, "framework": job.framework, "held_out": job.held_out, "fresh": job.fresh}
    if job.note:
        row["note"] = job.note
    to_measure = [ch for ch in job.changes if ch.label not in DECLARED]
    need_base = gains is None or any((job.name, ch.text) not in gains for ch in to_measure)
    # 1. as written: throughput, then gputop attached (an attach_early job: attached, then throughput)
    base = Running(job.argv(None, device, tiny), os.path.join(logs, f"{job.name}.base.log"))
    rate = None
    try:
        if job.attach_early:
            if not wait_ready(base, job.ready_timeout_s, base.attach):
                row["error"] = f"no attach line (exit {base.proc.poll()}); see {job.name}.base.log"
                return row
            row["attach_line_s"] = round(time.time() - base.started, 1)
        elif not wait_ready(base, job.ready_timeout_s):
            row["error"] = f"not ready (exit {base.proc.poll()}); see {job.name}.base.log"
            return row
        else:
            row["ready_s"] = round(time.time() - base.started, 1)
            if need_base:
                rate, row["gpm_base"] = measure(base, measure_s, gpm)  # a change to measure against it
                row["samples_per_s_base"] = rate
        report, launched, err = advise(base.proc.pid, advise_s, job.name)
        if report is not None:
            with open(os.path.join(logs, f"{job.name}.advise.json"), "w") as f:
                json.dump(report, f, indent=1)
        dump_stacks(base.proc.pid, os.path.join(logs, f"{job.name}.stacks.txt"))
        if err:
            row["error"] = err
        if report is not None and report.get("started_at"):
            row["attach_latency_s"] = round(report["started_at"] - launched, 2)
        row["samples_per_s_attached"] = base.rate_between(launched, time.time())
        if job.attach_early:  # its throughput once past the warm-up the advisor saw
            if not wait_ready(base, job.ready_timeout_s):
                row["error"] = f"not ready (exit {base.proc.poll()}); see {job.name}.base.log"
                return row
            row["ready_s"] = round(time.time() - base.started, 1)
            if need_base:
                rate, row["gpm_base"] = measure(base, measure_s, gpm)
                row["samples_per_s_base"] = rate
    finally:
        base.stop()
    # 2. each change: throughput only (or the gain an earlier run measured); a declared truth is not run
    measured = []
    for ch in job.changes:
        out: dict = {"label": ch.label, "change": ch.text}
        key = (job.name, ch.text)
        if ch.label in DECLARED:
            out["declared"] = True
        elif gains is not None and key in gains:
            out.update(gain=gains[key], gain_from="an earlier run")
        else:
            fixed = Running(job.argv(ch, device, tiny), os.path.join(logs, f"{job.name}.{len(measured)}.change.log"))
            try:
                if wait_ready(fixed, job.ready_timeout_s):
                    rate2, out["gpm"] = measure(fixed, measure_s, gpm)
                    out["samples_per_s"] = rate2
                    if rate and rate2:
                        out["gain"] = round(rate2 / rate, 3)
                else:
                    out["error"] = f"not ready (exit {fixed.proc.poll()})"
            finally:
                fixed.stop()
        measured.append(out)
    row["changes"] = measured
    best = max((c for c in measured if c.get("gain") is not None), key=lambda c: c["gain"], default=None)
    row["gain_measured"] = best["gain"] if best else None
    row["change"] = best["change"] if best else job.changes[0].text
    row["truth"] = best["label"] if best and best["gain"] >= HEALTHY_BELOW else "healthy"
    declared = [c for c in measured if c.get("declared")]
    if declared:  # a hang: the declared truth, whatever the throughput said
        row["truth"], row["change"] = declared[0]["label"], declared[0]["change"]
    row.update(judge(row["truth"], report))
    row["gain_predicted"] = row.pop("top_gain_predicted", None)
    return row


# ------------------------------------------------------------------------------- the report


def summary(rows: list[dict]) -> dict:
    def part(rs: list[dict]) -> dict:
        ok = [r for r in rs if r.get("correct")]
        ts = sorted(r["t_correct_s"] for r in ok if r.get("t_correct_s") is not None)
        return {"jobs": len(rs), "correct": len(ok), "share": round(len(ok) / len(rs), 3) if rs else None,
                "right_at_5s": sum(bool(r.get("right_at_5s")) for r in rs),
                "with_false_warnings": sum(bool(r.get("false_warnings")) for r in rs),
                "median_t_correct_s": statistics.median(ts) if ts else None, "max_t_correct_s": max(ts) if ts else None}

    return {"in_sample": part([r for r in rows if not r["held_out"]]), "held_out": part([r for r in rows if r["held_out"]]),
            "fresh": part([r for r in rows if r.get("fresh")]), "all": part(rows)}


def markdown(result: dict) -> str:
    s = result["summary"]

    def line(name: str, p: dict) -> str:
        t = "" if p["median_t_correct_s"] is None else f"; attach -> correct: median {p['median_t_correct_s']:.2f} s, max {p['max_t_correct_s']:.2f} s"
        fw = (f"; right at 5 s: {p['right_at_5s']} of {p['jobs']}; jobs shown a false warning: {p['with_false_warnings']}"
              if "right_at_5s" in p else "")
        return f"- **{name}: {p['correct']} of {p['jobs']} right**{t}{fw}"

    out = [
        "# Real jobs: is the advisor right on jobs it was not written for?",
        "",
        f"Machine: {result['machine']}; run {result['started']}; `gputop advise --pid P --duration {result['advise_duration_s']:g} --json`, "
        "no option overridden, attached after the job's warm-up. Versions: " + result.get("versions", "") + ".",
        "",
        line("held out (never tuned on)", s["held_out"]),
        line("of which fresh (written without reading the advisor's rules)", s["fresh"]),
        line("in-sample", s["in_sample"]),
        f"- targets: held out >= {TARGET_HELD_OUT:.0%} right, median attach -> correct <= {TARGET_T_CORRECT_S:g} s",
        "",
        "Truth is measured: each job also runs with the change its truth names, and the speed-up (samples/s) "
        f"is the gain. Under {HEALTHY_BELOW - 1:.0%} the job is healthy and any warning is wrong.",
        "",
    ]
    if result.get("runs"):
        out += ["## Runs", ""] + [f"- **{k}**: {v}" for k, v in result["runs"].items()] + [""]
    if result.get("reading"):
        out += ["## Reading the results", ""] + [f"- {x}" for x in result["reading"]] + [""]
    for title, held, fresh in (("Held out", True, False), ("Fresh (held out)", True, True),
                               ("In-sample", False, False)):
        rows = [r for r in result["jobs"] if r["held_out"] == held and bool(r.get("fresh")) == fresh]
        if not rows:
            continue
        out += [f"## {title}", "",
                "| job | framework | truth | gain measured | top finding | gain predicted | right | attach -> right (s) | rule fired (s) | right at 5 s | false warnings |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            g = r.get("gain_measured")
            t = r.get("t_correct_s")
            tf = r.get("t_fired_s")
            out.append(
                f"| {r['name']} | {r['framework']} | {r.get('truth', '?')} | {'-' if g is None else f'{g:.2f}x'} | "
                f"{r.get('top_finding') or '(none)'} | {r.get('gain_predicted') or '-'} | "
                f"{'yes' if r.get('correct') else 'NO'} | {'-' if t is None else f'{t:.1f}'} | {'-' if tf is None else f'{tf:.1f}'} | "
                f"{'-' if 'right_at_5s' not in r else ('yes' if r['right_at_5s'] else 'NO')} | "
                f"{', '.join(r['false_warnings']) if r.get('false_warnings') else ('0' if 'false_warnings' in r else '-')} |")
        out.append("")
    out += ["## Changes measured", ""]
    for r in result["jobs"]:
        for c in r.get("changes", []):
            if c.get("declared"):
                out.append(f"- **{r['name']}**: {c['change']} -> not run (the truth is declared: {c['label']})")
                continue
            src = " (gain from an earlier run)" if c.get("gain_from") else ""
            out.append(f"- **{r['name']}**: {c['change']} -> {c.get('gain', '?')}x{src}"
                       + (f" ({c['error']})" if c.get("error") else ""))
        if r.get("error"):
            out.append(f"- **{r['name']}**: error: {r['error']}")
    notes = [r for r in result["jobs"] if r.get("note") and not r.get("fresh")]
    if notes:
        out += ["", "## Jobs moved out of the held-out set", ""]
        out += [f"- **{r['name']}**: {r['note']}." for r in notes]
    out += ["", "## Top actions given", ""]
    for r in result["jobs"]:
        if r.get("top_action"):
            out.append(f"- **{r['name']}** ({r['top_finding']}): {r['top_action']}")
    out.append("")
    return "\n".join(out)


@functools.lru_cache(maxsize=1)
def versions() -> str:
    out = []
    for mod in ("torch", "transformers", "lightning", "accelerate", "timm", "torchvision"):
        try:
            out.append(f"{mod} {__import__(mod).__version__}")
        except Exception:
            pass
    return ", ".join(out)


def write(args, rows: list[dict], started: float) -> dict:
    """The JSON and the markdown for the rows so far (after every job: a run cut short keeps them)."""
    rows = list(rows)
    if args.merge:
        with open(args.merge) as f:
            done = {r["name"] for r in rows}
            rows = [r for r in json.load(f)["jobs"] if r["name"] not in done] + rows
        order = [j.name for j in JOBS]
        rows.sort(key=lambda r: order.index(r["name"]) if r["name"] in order else 99)
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        gpu = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        gpu = "no GPU"
    result = {
        "machine": f"{os.cpu_count()} cores, {gpu}, Python {platform.python_version()}",
        "device": args.device,
        "versions": versions(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "wall_s": round(time.time() - started, 1),
        "healthy_below": HEALTHY_BELOW,
        "advise_duration_s": args.advise_s,
        "jobs": rows,
    }
    result["summary"] = summary(rows)
    with open(os.path.join(args.out, "real_jobs.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "real_jobs.md"), "w") as f:
        f.write(markdown(result))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny models (a CPU smoke test of the bench itself)")
    p.add_argument("--jobs", help="comma-separated subset")
    p.add_argument("--held-out", choices=("only", "no", "all"), default="all")
    p.add_argument("--gains-from", help="a real_jobs.json whose measured gains to reuse (verdicts only)")
    p.add_argument("--measure-s", type=float, default=MEASURE_S)
    p.add_argument("--advise-s", type=float, default=ADVISE_S)
    p.add_argument("--merge", help="a real_jobs.json whose other jobs to keep in the output")
    p.add_argument("--record-dir", help="keep each advise session as DIR/JOB.gputop")
    args = p.parse_args(argv)
    if args.record_dir:
        global RECORD_DIR
        os.makedirs(args.record_dir, exist_ok=True)
        RECORD_DIR = args.record_dir
    os.makedirs(args.out, exist_ok=True)
    logs = os.path.join(args.out, "real_jobs_logs")
    os.makedirs(logs, exist_ok=True)
    wanted = args.jobs.split(",") if args.jobs else None
    jobs = [j for j in JOBS if (wanted is None or j.name in wanted)
            and (args.held_out == "all" or j.held_out == (args.held_out == "only"))]
    if wanted is not None:  # run in the order asked: the jobs that matter most first, under a time limit
        jobs.sort(key=lambda j: wanted.index(j.name))
    gains = None
    if args.gains_from:
        with open(args.gains_from) as f:
            gains = {}
            for r in json.load(f)["jobs"]:
                for c in r.get("changes", [{"change": r.get("change"), "gain": r.get("gain_measured")}]):
                    if c.get("gain") is not None:
                        gains[(r["name"], c["change"])] = c["gain"]
    gpm = GpmProbe() if args.device == "cuda" else None
    started = time.time()
    rows = []
    for i, job in enumerate(jobs):
        print(f"[{i + 1}/{len(jobs)}] {job.name} ...", file=sys.stderr, flush=True)
        try:
            row = run_job(job, args.device, args.tiny, logs, gains, gpm, args.measure_s, args.advise_s)
        except Exception as exc:  # one job failing must not lose the others
            row = {"name": job.name, "framework": job.framework, "held_out": job.held_out, "fresh": job.fresh,
                   "error": repr(exc), "correct": False}
        print(f"    truth={row.get('truth')} gain={row.get('gain_measured')} top={row.get('top_finding')} "
              f"correct={row.get('correct')} t={row.get('t_correct_s')} {row.get('error', '')}", file=sys.stderr, flush=True)
        rows.append(row)
        write(args, rows, started)
    result = write(args, rows, started)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
