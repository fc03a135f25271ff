"""Two-rank training jobs (DDP, one FSDP2), each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh12.py \\
        --job MODE --device cuda|cpu [--fixed] [--seconds N]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``, bf16 autocast; ``patent_lm`` initialises
``cuda:nccl,cpu:gloo`` as its offload recipe does), gloo on the CPU (small sizes, fp32, one thread per
rank, each rank on a core of its own where there are two). ``--fixed`` is the same job once its user
has fixed the problem; the bench compares the two by the samples/s rank 0 prints (the hang,
``claims_router``, has a ``--fixed`` too, which simply keeps training). Plain PyTorch only: every model
is built in code with random weights, every data set is generated in memory. The CUDA sizes were
reasoned out, not run: no GPU was at hand.

The jobs, as their users would tell it (then what is really going on, and what ``--fixed`` should
gain; CPU figures in ``TRUTHS[mode]["measured_cpu"]`` come from a shared 2-core machine under load
from other work, where pairs of runs of one and the same job differ by tens of percent on their own):

``leaf_disease``
    Plant-disease classification from leaf photos (38 classes, PlantVillage-style): a ViT-B/16 (CPU:
    width 64, 2 layers, 16 photos of 32 px per rank; CUDA: 86M parameters, 128 photos of 224 px per
    rank), DDP, AdamW, clipping; photos (uint8) on the device. Every 50 steps the script validates on
    the held-out split (CUDA 24,576 photos, batch 512) inside the training loop, under
    ``if rank == 0:`` "to keep it simple", with ``model.module``. "Every few seconds both GPUs stall;
    rank 1 sits at 0 % for seconds at a time."
    Truth: straggler, rank 0, phase ``compute`` (evaluation). While rank 0 runs ``evaluate`` over the
    whole split (~3 s on CUDA), rank 1 has gone on to its next step and waits in DDP's first gradient
    all-reduce for rank 0. ``--fixed``: every rank validates its strided half of the split and the
    counts are summed with one ``all_reduce``. Expected gain on CUDA: 50 steps of ~45 ms (~2.3 s) per
    ~2.9 s of rank-0 validation as-is, ~1.45 s split: (2.3 + 2.9) / (2.3 + 1.45) = ~1.4x (bound 2x).

``claims_router``
    Routing customer-support tickets to 24 queues: a small Transformer encoder (CPU: width 64, 2 layers,
    16 x 64 tokens per rank; CUDA: width 512, 8 layers, 64 x 256 tokens per rank), DDP, AdamW. Every 100
    steps rank 0 saves a checkpoint, and the ranks are meant to wait for it on a barrier of a gloo group
    created for CPU-side coordination; the ``dist.barrier(group=ckpt_group)`` ended up indented under
    ``if rank == 0:``. "It trains fine for a few seconds, then both GPUs go quiet and nothing more is
    printed; no error."
    Truth: stuck at the first checkpoint (step 100), cause rank 0: it alone enters the gloo barrier and
    waits there for rank 1, which never calls it; rank 1 goes on to step 101, whose gradient all-reduce
    waits for rank 0 (NCCL: its GPU spins in the all-reduce kernel and its host blocks at the next
    ``loss.item()``, step 110; gloo: its host blocks at the end of ``loss.backward()``). ``--fixed``:
    the barrier on every rank, after rank 0's save.

``patent_lm``
    Continued pretraining of a 610M-parameter decoder on patent claims (CPU: width 64, 2 layers; CUDA:
    16 layers, width 1,536, 8 x 2,048 tokens per rank), FSDP2 (``fully_shard`` per block and at the
    root, bf16 parameters, fp32 reductions), AdamW, clipping. The sharding config comes from the team's
    13B recipe, which needed ``offload_policy=CPUOffloadPolicy()``: the sharded parameters, gradients
    and AdamW states live in (pinned) host memory. "Two H200s and the GPUs are idle most of the time;
    each step takes seconds."
    Truth: inefficient, both ranks alike, phase ``host``. Every step each rank's ``optimizer.step()``
    runs AdamW on the CPU over its 305M-parameter shard (torch's per-parameter loop: ~7 elementwise
    passes over ~1.2 GB tensors, one intra-op thread per rank since torchrun sets OMP_NUM_THREADS=1),
    ``clip_grad_norm_`` too, after the gradients are copied to the host; the forward and backward copy
    the shards to the GPU before each all-gather. The GPUs do ~150 ms of work in a ~3 s step.
    ``--fixed``: no offload policy (parameters, gradients and optimizer states on the GPU: ~10 GB per
    rank). Expected gain on CUDA: ~15-20x (at least 8x). CPU: cannot show it (CPUOffloadPolicy needs an
    accelerator; on the CPU both variants are the same un-offloaded FSDP2 job).

``aerial_mae``
    Masked-autoencoder pretraining on aerial imagery: a ViT-B/16 encoder over the 25 % visible patches
    and an 8-layer, 512-wide decoder (CPU: width 64, 2 layers, 16 tiles of 32 px per rank; CUDA: 111M
    parameters, 256 tiles of 224 px per rank), DDP, AdamW, normalised-pixel loss; tiles (uint8) live on
    the device, masks are drawn there. Truth: healthy: compute-bound (~14 TFLOP per rank per step,
    ~35-40 ms on an H100), one ~450 MB fp32 gradient all-reduce overlapped with the backward, balanced
    ranks. ``--fixed``: the same job. Expected gain: none (1.00x).

Every rank prints ``gputop-workload ready pid=P`` once past its warm-up (a few optimizer steps,
then a ``torch.cuda.synchronize()`` on CUDA): one line per rank, so two such lines mean both ranks
are training. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks; N: optimizer steps). Every process ends when its launcher dies (also
one killed while the process was still importing) or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "leaf_disease": {
        "verdict": "straggler", "rank": 0, "phase": "compute",
        "where": {0: "evaluate(model.module, val_photos, ...) inside the training loop every 50 steps under "
                     "`elif t.rank == 0`: the whole 24,576-photo validation split (CUDA) forward in bf16, ~3 s, "
                     "while rank 1 waits",
                  1: "trains; after every 50th step waits in DDP's first gradient all-reduce of the next step for "
                     "rank 0 to come back from validation (NCCL: GPU in the all-reduce kernel; gloo: host inside "
                     "loss.backward())"},
        "names": ["evaluate", "eval_every", "val_photos", "rank == 0", "model.module", "job_leaf_disease"],
        "fix": "validate on every rank, each on its strided share of the split, and sum the counts with one "
               "all_reduce (what --fixed does); or validate less often / asynchronously on a spare device",
        "expected_gain": "about 1.4x on CUDA (1.25x-1.6x; 2x is the bound): 50 training steps of ~45 ms (ViT-B/16, "
                         "128 x 224 px per rank, ~13.5 TFLOP) = ~2.3 s per validation; as-is rank 0 validates "
                         "24,576 photos (~0.86 PFLOP forward, ~2.9 s) while rank 1 idles, fixed each rank does half "
                         "(~1.45 s): 5.2 / 3.75 = 1.39x",
        "measured_cpu": "one 40 s pair under load: as-is 3,905 steps, --fixed 3,981 (1.02x): at the CPU sizes "
                        "rank 0's validation of 1,024 32-px photos is short next to 50 training steps; the CUDA "
                        "ratio rests on the reasoning above",
        "note": "Evaluation only on the main process, inside the training loop: a periodic, rank-0-only stall "
                "that the other rank pays for in its next collective. Not a data or communication problem, and "
                "not every step: ~55 % of the time as-is is rank 0's validation.",
        "script": "multi_rank_fresh12.py",
    },
    "claims_router": {
        "verdict": "stuck", "rank": 0, "phase": "comm",
        "where": {0: "dist.barrier(group=ckpt_group) (a gloo group) after save_checkpoint at step 100, inside "
                     "`if t.rank == 0:` in job_claims_router: waits for rank 1, which never enters it; its GPU idle",
                  1: "past step 100 without the barrier: NCCL: its GPU spins in the gradient all-reduce of step 101 "
                     "(rank 0 never joins) and its host blocks at loss.item() in step 110; gloo: its host blocks "
                     "at the end of loss.backward() in step 101, waiting for that all-reduce"},
        "names": ["barrier", "ckpt_group", "save_checkpoint", "ckpt_every", "new_group", "job_claims_router"],
        "fix": "call the barrier on every rank (outside the `if rank == 0:` block, after the save): what --fixed "
               "does",
        "expected_gain": "from no progress at all to training: the rates stop advancing at step 100 as-is",
        "measured_cpu": "as-is the rate lines stop at steps=100 ~1 s after start and stay there for the rest of a "
                        "40 s run (both ready lines printed first, rank 0 logs its step-100 checkpoint); --fixed "
                        "reached 2,049 steps in the same time",
        "note": "A collective reached by one rank only (an indentation slip under `if rank == 0:`), on a "
                "second (gloo) process group, so each rank waits in a different collective on a different "
                "group: a deadlock, not a straggler, and no NCCL error (the watchdog's timeout is the job's "
                "length plus two minutes).",
        "script": "multi_rank_fresh12.py",
    },
    "patent_lm": {
        "verdict": "inefficient", "rank": None, "phase": "host",
        "where": {0: "FSDP2 fully_shard(..., offload_policy=CPUOffloadPolicy()): optimizer.step() (AdamW's "
                     "per-parameter loop on CPU DTensor shards, one thread) and clip_grad_norm_ on the host every "
                     "step; shard copies host-to-device before each all-gather and gradients device-to-host after "
                     "each reduce-scatter; the GPU idle ~95 % of the step",
                  1: "the same"},
        "names": ["fully_shard", "CPUOffloadPolicy", "offload_policy", "AdamW", "optimizer.step", "job_patent_lm"],
        "fix": "drop the CPU offload policy (what --fixed does): the 610M-parameter model's bf16/fp32 parameters, "
               "gradients and AdamW states are ~10 GB per rank sharded over two GPUs; the optimizer then runs on "
               "the GPU",
        "expected_gain": "about 15-20x on CUDA (at least 8x): fixed, a step is 6 x 610M x 16,384 = 60 TFLOP of "
                         "matmuls (~110 ms), causal flash attention (~12 ms), elementwise and cross entropy "
                         "(~22 ms), FSDP all-gathers and reduce-scatters over NVLink mostly hidden, AdamW on the GPU "
                         "(~3 ms): ~150 ms. As-is AdamW on the CPU over 305M parameters per rank is ~7 passes x "
                         "~10 bytes per element (~24 GB) on one thread at ~8-12 GB/s = ~2-3 s, clipping on the "
                         "host ~0.2 s, the host-device copies of shards and gradients (~3.6 GB per rank per step, "
                         "pinned) ~0.15 s: ~2.5-3.5 s",
        "measured_cpu": "cannot show it (CPUOffloadPolicy needs an accelerator; both variants are the same job on "
                        "the CPU): 1,286 against 1,296 steps on one 40 s pair",
        "note": "CPU offload left on for a model that fits easily on the GPUs: the step is the host's optimizer "
                "and clipping, both ranks alike. Not a data or communication problem.",
        "script": "multi_rank_fresh12.py",
    },
    "aerial_mae": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: MAE forward/backward on device-resident tiles, one gradient all-reduce per step "
                     "overlapped with the backward",
                  1: "the same"},
        "names": [],
        "fix": None,
        "expected_gain": "none (1.00x): compute-bound (~14 TFLOP per rank per step: the encoder on 50 of 197 "
                         "tokens, the decoder on all 197; ~35-40 ms on an H100), ~450 MB fp32 all-reduce (~2-3 ms "
                         "over NVLink) overlapped, data and masks on the device, balanced ranks",
        "measured_cpu": "one 40 s pair under load: as-is 4,254 steps, --fixed (the same job) 3,792: 1.12x the "
                        "other way, the machine's noise",
        "note": "Masked-autoencoder pretraining done right: data on the device, fused AdamW, balanced ranks. No "
                "warning is right.",
        "script": "multi_rank_fresh12.py",
    },
}

import argparse
import math
import os
import sys
import tempfile
import threading
import time
from datetime import timedelta

LAUNCHER = os.getppid()  # taken before the slow imports: a launcher killed while they run is still noticed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from common import RATE_EVERY_S, log, watchdog
except ImportError:  # run from a copy without its neighbours
    RATE_EVERY_S = 0.5

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def watchdog(seconds: float) -> None:
        def stop() -> None:
            time.sleep(seconds)
            os._exit(0)

        parent = os.getppid()

        def orphan() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(0)

        threading.Thread(target=stop, daemon=True).start()
        threading.Thread(target=orphan, daemon=True).start()

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

MODES = tuple(TRUTHS)

# The jobs whose recipe initialises a CPU backend beside NCCL (CPU-offloaded FSDP2 shards).
CPU_BACKEND_TOO = {"patent_lm"}


# --------------------------------------------------------------------------- what every job shares


def say(line: str) -> None:
    """One progress line on stdout, in a single write (the two ranks share the launcher's stdout)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Trainer:
    """One rank of a job: where it runs, whether it is the fixed variant, its progress lines."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.fixed = args.fixed
        self.cuda = args.device == "cuda"
        self.small = args.tiny or not self.cuda
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.dev = torch.device("cuda", self.local) if self.cuda else torch.device("cpu")
        self.warm_steps = 6
        self.steps = 0
        self.samples = 0
        self.announced = False
        self._lock = threading.Lock()
        if self.rank == 0:
            threading.Thread(target=self._report, daemon=True, name="rate").start()

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.cuda)

    def wrap(self, model: nn.Module, **kw) -> DDP:
        model = model.to(self.dev)
        return DDP(model, device_ids=[self.local] if self.cuda else None, **kw)

    def trained(self, global_samples: int, optimizer_step: bool = True) -> None:
        """After each micro-batch (or step): count its samples (over all ranks); past the warm-up, say so once."""
        with self._lock:
            self.samples += global_samples
            if optimizer_step:
                self.steps += 1
        if not self.announced and self.steps >= self.warm_steps:
            self.announced = True
            if self.cuda:
                torch.cuda.synchronize()
            say(f"gputop-workload ready pid={os.getpid()}")

    def _report(self) -> None:
        while True:
            time.sleep(RATE_EVERY_S)
            with self._lock:
                line = f"gputop-workload rate t={time.time():.3f} steps={self.steps} samples={self.samples}"
            say(line)


def count_params(model: nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def adamw(t: Trainer, params, lr: float, **kw) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, fused=t.cuda or None, **kw)


def warmup_cosine(opt: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


class Attention(nn.Module):
    """Multi-head self-attention through ``scaled_dot_product_attention``; q/k/v fused or (BERT-style) apart."""

    def __init__(self, width: int, heads: int, fused_qkv: bool = True) -> None:
        super().__init__()
        self.heads = heads
        if fused_qkv:
            self.qkv = nn.Linear(width, 3 * width)
        else:
            self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(x).split(C, dim=-1)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (z.view(B, T, self.heads, C // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(a.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """A pre-LN Transformer block (GELU MLP, 4x wide)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


def sincos(positions: int, width: int, device: torch.device) -> torch.Tensor:
    pos = torch.arange(positions, device=device, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, width, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / width))
    return torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=1)


# --------------------------------------------------------------------------- leaf_disease


class ViT(nn.Module):
    def __init__(self, image: int, patch: int, width: int, layers: int, heads: int, classes: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


LEAF_MEAN = (0.45, 0.50, 0.38)
LEAF_STD = (0.20, 0.19, 0.21)


def leaf_normalise(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(LEAF_MEAN, device=x.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(LEAF_STD, device=x.device).view(1, 3, 1, 1) * 255
    return (x.float() - mean) / std


@torch.no_grad()
def evaluate(t: Trainer, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int) -> float:
    """Top-1 accuracy over ``images`` (this process's share of the validation split)."""
    model.eval()
    correct = torch.zeros((), device=t.dev)
    for s in range(0, len(images), batch):
        with t.autocast():
            logits = model(leaf_normalise(images[s:s + batch]))
        correct += (logits.argmax(-1) == labels[s:s + batch]).sum()
    model.train()
    counts = torch.stack([correct, torch.tensor(float(len(images)), device=t.dev)])
    if t.fixed:  # every rank evaluated its share: add them up
        dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def job_leaf_disease(t: Trainer) -> None:
    if t.small:
        cfg = {"n": 512, "val": 1024, "size": 32, "patch": 8, "width": 64, "layers": 2, "heads": 4, "batch": 16,
               "eval_batch": 128, "eval_every": 50, "classes": 38}
    else:
        cfg = {"n": 8192, "val": 24576, "size": 224, "patch": 16, "width": 768, "layers": 12, "heads": 12,
               "batch": 128, "eval_batch": 512, "eval_every": 50, "classes": 38}
    g = torch.Generator(device=t.dev).manual_seed(90 + t.rank)  # the rank's share of the training photos
    photos = torch.randint(0, 256, (cfg["n"], 3, cfg["size"], cfg["size"]), generator=g, device=t.dev,
                           dtype=torch.uint8)
    labels = torch.randint(0, cfg["classes"], (cfg["n"],), generator=g, device=t.dev)
    gv = torch.Generator(device=t.dev).manual_seed(99)  # the validation split, the same on every rank
    val_photos = torch.randint(0, 256, (cfg["val"], 3, cfg["size"], cfg["size"]), generator=gv, device=t.dev,
                               dtype=torch.uint8)
    val_labels = torch.randint(0, cfg["classes"], (cfg["val"],), generator=gv, device=t.dev)
    model = t.wrap(ViT(cfg["size"], cfg["patch"], cfg["width"], cfg["layers"], cfg["heads"], cfg["classes"]))
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 5e-4, weight_decay=0.05)
    sched = warmup_cosine(opt, 500, 50_000)
    if t.rank == 0:
        log(f"leaf-disease ViT {count_params(model):.1f}M parameters, {cfg['batch']} photos per rank, validation of "
            f"{cfg['val']} photos every {cfg['eval_every']} steps "
            f"{'split over the ranks' if t.fixed else 'on rank 0'}")
    model.train()
    step, best = 0, 0.0
    while True:
        order = torch.randperm(cfg["n"], device=t.dev, generator=g)
        for s in range(0, cfg["n"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[s:s + cfg["batch"]]
            x = photos[idx]
            flip = torch.rand(len(idx), 1, 1, 1, device=t.dev, generator=g) < 0.5
            x = leaf_normalise(torch.where(flip, x.flip(3), x))
            with t.autocast():
                logits = model(x)
            loss = F.cross_entropy(logits.float(), labels[idx], label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % cfg["eval_every"] == 0:
                if t.fixed:  # each rank validates its strided share, the counts are summed
                    acc = evaluate(t, model.module, val_photos[t.rank::t.world], val_labels[t.rank::t.world],
                                   cfg["eval_batch"])
                elif t.rank == 0:  # validation on the main process only, "to keep it simple"
                    acc = evaluate(t, model.module, val_photos, val_labels, cfg["eval_batch"])
                if t.rank == 0:
                    best = max(best, acc)
                    log(f"step {step}: loss {loss.item():.4f} val acc {acc:.4f} (best {best:.4f})")


# --------------------------------------------------------------------------- claims_router


class TicketClassifier(nn.Module):
    """A small Transformer encoder over the ticket's subject and body, mean-pooled, then the queue head."""

    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int, queues: int) -> None:
        super().__init__()
        self.width = width
        self.tok = nn.Embedding(vocab, width, padding_idx=0)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, queues)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = (ids != 0)
        x = self.tok(ids) + sincos(ids.shape[1], self.width, ids.device)
        mask = keep[:, None, None, :]
        for block in self.blocks:
            x = block(x, mask)
        x = self.norm(x)
        pooled = (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1)
        return self.head(pooled)


def save_checkpoint(path: str, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def job_claims_router(t: Trainer) -> None:
    if t.small:
        cfg = {"vocab": 4000, "ctx": 64, "width": 64, "layers": 2, "heads": 4, "batch": 16, "n": 2048,
               "ckpt_every": 100, "queues": 24}
    else:
        cfg = {"vocab": 32000, "ctx": 256, "width": 512, "layers": 8, "heads": 8, "batch": 64, "n": 16384,
               "ckpt_every": 100, "queues": 24}
    g = torch.Generator(device=t.dev).manual_seed(110 + t.rank)  # the rank's share of the labelled tickets
    ids = torch.randint(5, cfg["vocab"], (cfg["n"], cfg["ctx"]), generator=g, device=t.dev)
    length = torch.randint(cfg["ctx"] // 4, cfg["ctx"] + 1, (cfg["n"], 1), generator=g, device=t.dev)
    ids = ids.masked_fill(torch.arange(cfg["ctx"], device=t.dev) >= length, 0)
    queue = torch.randint(0, cfg["queues"], (cfg["n"],), generator=g, device=t.dev)
    model = t.wrap(TicketClassifier(cfg["vocab"], cfg["ctx"], cfg["width"], cfg["layers"], cfg["heads"],
                                    cfg["queues"]))
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 3e-4, weight_decay=0.01)
    sched = warmup_cosine(opt, 300, 30_000)
    # CPU-side coordination (the checkpoint barrier) goes through its own gloo group, away from the NCCL stream
    ckpt_group = dist.new_group(backend="gloo")
    run_dir = tempfile.mkdtemp(prefix="claims_router_") if t.rank == 0 else None
    if t.rank == 0:
        log(f"ticket router {count_params(model):.1f}M parameters, {cfg['batch']} x {cfg['ctx']} tokens per rank, "
            f"checkpoint every {cfg['ckpt_every']} steps to {run_dir}")
    model.train()
    step, running = 0, 0.0
    while True:
        for s in torch.randperm(cfg["n"] // cfg["batch"]).tolist():
            x = ids[s * cfg["batch"]:(s + 1) * cfg["batch"]]
            y = queue[s * cfg["batch"]:(s + 1) * cfg["batch"]]
            with t.autocast():
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 10 == 0:
                running = 0.9 * running + 0.1 * loss.item()
            if step % cfg["ckpt_every"] == 0:
                if t.rank == 0:
                    save_checkpoint(os.path.join(run_dir, "last.pt"), model.module, opt, step)
                    log(f"step {step}: loss {running:.4f}, checkpoint saved")
                    if not t.fixed:
                        dist.barrier(group=ckpt_group)  # nobody moves on before the checkpoint is on disk
                if t.fixed:
                    dist.barrier(group=ckpt_group)


# --------------------------------------------------------------------------- patent_lm


class DecoderBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width, bias=False), nn.LayerNorm(width, bias=False)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.fc_proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class PatentLM(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList(DecoderBlock(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, bias=False)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def job_patent_lm(t: Trainer) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if t.small:
        cfg = {"vocab": 2048, "ctx": 64, "width": 64, "layers": 2, "heads": 4, "batch": 4, "tokens": 400_000}
    else:
        cfg = {"vocab": 50304, "ctx": 2048, "width": 1536, "layers": 16, "heads": 12, "batch": 8,
               "tokens": 50_000_000}
    g = torch.Generator(device=t.dev).manual_seed(120 + t.rank)  # the rank's shard of tokenized patent claims
    corpus = torch.randint(0, cfg["vocab"], (cfg["tokens"],), generator=g, device=t.dev, dtype=torch.int32)
    model = PatentLM(cfg["vocab"], cfg["ctx"], cfg["width"], cfg["layers"], cfg["heads"])
    # the sharding config comes from the team's 13B recipe; on the CPU (no accelerator) there is nothing to offload to
    offload = t.cuda and not t.fixed
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} if t.cuda else {}
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    else:
        model = model.to(t.dev)
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4 if not t.small else 1e-3, betas=(0.9, 0.95),
                            weight_decay=0.1)
    sched = warmup_cosine(opt, 500, 100_000)
    if t.rank == 0:
        log(f"patent-claims LM {count_params(model):.0f}M parameters, FSDP2 over {t.world} ranks, "
            f"{cfg['batch']} x {cfg['ctx']} tokens per rank, CPU offload {offload}")
    offsets = torch.arange(cfg["ctx"] + 1, device=t.dev)
    model.train()
    step = 0
    while True:
        start = torch.randint(0, cfg["tokens"] - cfg["ctx"] - 1, (cfg["batch"], 1), generator=g, device=t.dev)
        w = corpus[start + offsets].long()
        loss = model(w[:, :-1], w[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        t.trained(cfg["batch"] * t.world)
        if step % 10 == 0 and t.rank == 0:
            log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- aerial_mae


class MAE(nn.Module):
    """A masked autoencoder (He et al.): the ViT encoder sees the 25 % visible patches, a light decoder
    reconstructs the normalised pixels of the masked ones."""

    def __init__(self, image: int, patch: int, width: int, layers: int, heads: int, dec_width: int,
                 dec_layers: int, dec_heads: int, channels: int) -> None:
        super().__init__()
        self.p, self.n = patch, (image // patch) ** 2
        self.embed = nn.Linear(channels * patch * patch, width)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.register_buffer("pos", sincos(self.n + 1, width, torch.device("cpu"))[None], persistent=False)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.dec_embed = nn.Linear(width, dec_width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec_width))
        self.register_buffer("dec_pos", sincos(self.n + 1, dec_width, torch.device("cpu"))[None], persistent=False)
        self.dec_blocks = nn.ModuleList(Block(dec_width, dec_heads) for _ in range(dec_layers))
        self.dec_norm = nn.LayerNorm(dec_width)
        self.pred = nn.Linear(dec_width, channels * patch * patch)
        nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        p = self.p
        return x.view(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1).reshape(B, self.n, p * p * C)

    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        patches = self.patchify(x)
        B, N, D = patches.shape
        keep = N // 4
        ids_shuffle = noise.argsort(dim=1)
        ids_restore = ids_shuffle.argsort(dim=1)
        ids_keep = ids_shuffle[:, :keep]
        h = self.embed(patches) + self.pos[:, 1:]
        h = torch.gather(h, 1, ids_keep[..., None].expand(-1, -1, h.shape[-1]))
        h = torch.cat([(self.cls + self.pos[:, :1]).expand(B, -1, -1), h], dim=1)
        for block in self.blocks:
            h = block(h)
        h = self.dec_embed(self.norm(h))
        mask_tokens = self.mask_token.expand(B, N - keep, -1).to(h.dtype)
        d = torch.cat([h[:, 1:], mask_tokens], dim=1)
        d = torch.gather(d, 1, ids_restore[..., None].expand(-1, -1, d.shape[-1]))
        d = torch.cat([h[:, :1], d], dim=1) + self.dec_pos
        for block in self.dec_blocks:
            d = block(d)
        pred = self.pred(self.dec_norm(d))[:, 1:].float()
        target = patches.float()
        target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
        mask = torch.ones(B, N, device=x.device)
        mask[:, :keep] = 0
        mask = torch.gather(mask, 1, ids_restore)
        return (((pred - target) ** 2).mean(-1) * mask).sum() / mask.sum()


def job_aerial_mae(t: Trainer) -> None:
    if t.small:
        cfg = {"n": 512, "size": 32, "patch": 8, "width": 64, "layers": 2, "heads": 4, "dec_width": 32,
               "dec_layers": 1, "dec_heads": 4, "batch": 16}
    else:
        cfg = {"n": 8192, "size": 224, "patch": 16, "width": 768, "layers": 12, "heads": 12, "dec_width": 512,
               "dec_layers": 8, "dec_heads": 16, "batch": 256}
    g = torch.Generator(device=t.dev).manual_seed(130 + t.rank)  # the rank's aerial tiles (RGB), uint8 on the device
    tiles = torch.randint(0, 256, (cfg["n"], 3, cfg["size"], cfg["size"]), generator=g, device=t.dev,
                          dtype=torch.uint8)
    mean = torch.tensor([0.36, 0.38, 0.33], device=t.dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.18, 0.16, 0.15], device=t.dev).view(1, 3, 1, 1) * 255
    model = t.wrap(MAE(cfg["size"], cfg["patch"], cfg["width"], cfg["layers"], cfg["heads"], cfg["dec_width"],
                       cfg["dec_layers"], cfg["dec_heads"], 3))
    opt = adamw(t, model.parameters(), lr=1.5e-4 * cfg["batch"] * t.world / 256, betas=(0.9, 0.95), weight_decay=0.05)
    sched = warmup_cosine(opt, 400, 80_000)
    if t.rank == 0:
        log(f"aerial MAE {count_params(model):.1f}M parameters, {cfg['batch']} tiles of {cfg['size']} px per rank, "
            f"75 % masking, data on the device")
    model.train()
    step = 0
    while True:
        order = torch.randperm(cfg["n"], device=t.dev, generator=g)
        for s in range(0, cfg["n"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[s:s + cfg["batch"]]
            x = tiles[idx]
            flip = torch.rand(len(idx), 1, 1, 1, device=t.dev, generator=g) < 0.5
            x = (torch.where(flip, x.flip(3), x).float() - mean) / std
            noise = torch.rand(len(idx), (cfg["size"] // cfg["patch"]) ** 2, device=t.dev, generator=g)
            with t.autocast():
                loss = model(x, noise)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


JOBS = {"leaf_disease": job_leaf_disease, "claims_router": job_claims_router, "patent_lm": job_patent_lm,
        "aerial_mae": job_aerial_mae}


# --------------------------------------------------------------------------- main


def follow_launcher() -> None:
    """End with the launcher, also where it died before this process got here (its parent is then another)."""
    def orphan() -> None:
        while os.getppid() == LAUNCHER and LAUNCHER != 1:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphan, daemon=True, name="launcher").start()


def pin_to_own_core(rank: int) -> None:
    """On the CPU a rank's core is its device: one each, so that only what shares it slows it."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return
    if len(cores) >= 2:
        os.sched_setaffinity(0, {cores[rank % len(cores)]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True, choices=MODES)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--fixed", action="store_true", help="the same job with its problem fixed")
    ap.add_argument("--tiny", action="store_true", help="small sizes (always on with --device cpu)")
    ap.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    args = ap.parse_args(argv)
    watchdog(args.seconds)
    follow_launcher()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    timeout = timedelta(seconds=args.seconds + 120)
    if args.device == "cuda":
        torch.cuda.set_device(local)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        if args.job in CPU_BACKEND_TOO:  # the offload recipe's backend: CPU-resident shards need gloo for their collectives
            dist.init_process_group("cuda:nccl,cpu:gloo", timeout=timeout)
        else:
            try:
                dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local))
            except TypeError:  # PyTorch < 2.3
                dist.init_process_group("nccl", timeout=timeout)
    else:
        torch.set_num_threads(1)
        pin_to_own_core(int(os.environ.get("RANK", local)))
        dist.init_process_group("gloo", timeout=timeout)
    torch.manual_seed(0)
    trainer = Trainer(args)
    JOBS[args.job](trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
