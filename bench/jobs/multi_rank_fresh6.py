"""Two-rank training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh6.py \\
        --job MODE --device cuda|cpu [--fixed]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``), gloo on the CPU (small sizes, one thread per rank,
each rank on a core of its own where there are two). ``--fixed`` is the same job once its user has
fixed the problem; the bench compares the two by the samples/s rank 0 prints.

The jobs, as their users would tell it (then what is really going on, and what ``--fixed`` should
gain, with the arithmetic, written before any measurement):

``accelerate_vit``
    ViT-Base/16 image classification (``transformers.ViTForImageClassification`` from a
    ``ViTConfig``, ~86M parameters, 1000 classes, no pretrained weights) with Hugging Face
    Accelerate under torchrun: ``Accelerator(mixed_precision="bf16")``, ``accelerator.prepare``
    on the model, a fused AdamW and the DataLoader (6 workers, pinned memory, 128 images per rank
    of uint8 224 x 224 images kept in memory, random flips), normalization on the GPU, label
    smoothing, gradient clipping, the loss read every 100 steps. Both ranks do the same work.
    Nothing is wrong: no warning is right. ``--fixed``: the same job.
    Truth: healthy; each rank's GPU is busy with ~14 TFLOP of bf16 ViT-B work per step (6 x 86M
    x 128 x 197 tokens + attention), ~30-35 ms; the 344 MB fp32 gradient all-reduce takes ~1 ms
    over NVLink and overlaps the backward; 6 workers per rank can collate far more than the ~30
    batches per second the GPU takes. Expected gain of ``--fixed``: none (1.00x).

``naive_pipeline``
    A 2.7B-parameter GPT (width 2560, 32 layers, context 2048) that the team splits over the two
    GPUs by layers, because with AdamW it does not fit one: rank 0 holds the embeddings and layers
    0-15, rank 1 layers 16-31, the final norm and the LM head. Each step rank 0 runs its half on
    the batch (8 sequences), ``dist.send``s the activations to rank 1, which finishes the forward,
    computes the loss, runs its backward and ``dist.send``s the activation gradient back, with
    which rank 0 runs its backward; then both take their AdamW step (bf16 autocast, fused AdamW).
    ``--fixed``: the batch is cut into 4 micro-batches of 2 sequences and pipelined GPipe-style
    (rank 0 runs the 4 forwards back to back and ``isend``s each result; rank 1 runs forward and
    backward of each micro-batch as it arrives and ``isend``s its gradient back; rank 0 runs the 4
    backwards as the gradients arrive), one optimizer step per batch as before.
    Truth: inefficient, no straggler: with one micro-batch the two stages can never work at the
    same time, so each GPU idles about half of every step, waiting in ``recv`` for the other.
    Expected gain: about 1.5x (1.35x to 1.6x). Per stage ~1.26B parameters over 16,384 tokens is
    ~124 TFLOP plus ~10 TFLOP of attention: ~270 ms at ~500 TFLOPS effective, a third forward and
    two thirds backward (rank 1 also has the LM head: ~296 ms). Naive: 90 (rank 0 forward) + 296
    (rank 1) + 180 (rank 0 backward) + ~15 (AdamW) = ~580 ms per batch. GPipe with 4 micro-batches:
    rank 1 starts after rank 0's first micro-batch forward (22 ms), then works back to back (4 x
    74 ms), and rank 0 ends with the last micro-batch's backward (45 ms): 22 + 296 + 45 + 15 =
    ~380 ms, 580 / 380 = 1.53x, a little less for the smaller micro-batch matmuls.

``sorted_length_shards``
    A RoBERTa-large-sized review classifier (``transformers.RobertaForSequenceClassification``
    from a ``RobertaConfig``, ~355M parameters, 3 classes) fine-tuned with DDP (bf16 autocast,
    fused AdamW, 64 reviews per rank per step, each batch padded to its longest review, a multiple
    of 8). To cut padding, the user sorts the corpus by length and gives each rank its own
    contiguous part of the sorted list (``sorted_ids[rank * n // world:(rank + 1) * n // world]``),
    cuts that into batches of consecutive (similar-length) reviews and shuffles the batch order
    each epoch. Rank 0 gets the short half of the corpus, rank 1 the long half.
    ``--fixed``: the sorted corpus is cut into global batches of 64 x world consecutive reviews,
    the order of the global batches is shuffled with a seed all ranks share, and rank r takes rows
    r::world of each, so both ranks get reviews of about the same length at every step.
    Truth: straggler, rank 1: every step its batch is about three times as long (mean padded
    length ~243 tokens against ~82 on rank 0), so rank 0 finishes early and waits in DDP's
    gradient all-reduce for rank 1, about 60 % of every step.
    Expected gain: about 1.45x (1.3x to 1.6x). Lengths are log-normal (median 128 tokens,
    sigma 0.7, cut at 512; mean 162). A batch costs about 6 ms + 64 x L x (1.82 GFLOP + 0.3 MFLOP
    x L) at ~350 TFLOPS, and no step is shorter than ~25 ms (the CPU launching ~2,400 kernels).
    Sharded as now the step waits for rank 1: ~91 ms on average (rank 0 alone: ~35 ms). With the
    ranks balanced each step costs the mean over all global batches, ~63 ms: 91 / 63 = 1.44x.

``ddp_double_allreduce``
    GPT-2 medium (``transformers.GPT2LMHeadModel`` from a ``GPT2Config``, ~355M parameters)
    pre-trained with DDP, bf16 autocast, fused AdamW, gradient clipping, 8 x 1024 tokens per rank.
    The script started as the "Writing Distributed Applications" tutorial's hand-made data
    parallelism and was moved to ``DistributedDataParallel`` later, but ``average_gradients(model)``
    (for each parameter: ``dist.all_reduce(p.grad)``, then ``p.grad /= world``) is still called
    after ``loss.backward()``. The losses are the same either way (the gradients DDP already
    averaged are averaged again), so nobody noticed. ``--fixed``: ``average_gradients`` is no
    longer called.
    Truth: inefficient, no straggler: after DDP's bucketed all-reduce (overlapped with the
    backward) every step makes 292 more all-reduces, one per parameter tensor (1.42 GB of fp32
    gradients in all), plus 292 divisions, serialized between backward and optimizer step with
    nothing to overlap them; both GPUs wait on NCCL for that time.
    Expected gain: about 1.2x (1.1x to 1.4x). A step is ~19 TFLOP (6 x 354M x 8,192 tokens +
    attention), ~45 ms at ~420 TFLOPS, + ~4 ms fused AdamW and ~3 ms for the loss over the
    50,257-way logits: ~52 ms. The extra all-reduces move 1.42 GB at ~350 GB/s (~4 ms), with ~20 us
    of latency for each of the ~200 small ones (~4 ms), the divisions ~1-2 ms, and the CPU needs
    ~12-15 ms to issue the 584 calls: ~10-14 ms more per step, 64 / 52 = ~1.23x.

Every rank prints ``rank R ready`` once past its warm-up (a few steps, then a
``torch.cuda.synchronize()`` on CUDA). Rank 0 prints ``gputop-workload rate t=T steps=N
samples=M`` every half second (M: samples over both ranks; in ``naive_pipeline`` both ranks work
on the same batch, so a step is one batch). Every process ends when its launcher dies or after
``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "accelerate_vit": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: ViT-B/16 forward/backward under bf16 autocast (Accelerate), the DDP gradient all-reduce "
                     "overlapped with the backward, fused AdamW; DataLoader workers collate the next batches ahead",
                  1: "the same"},
        "names": [],
        "fix": None,
        "expected_gain": "none (1.00x)",
        "note": "Accelerate DDP ViT-Base/16 (~86M, from config), 128 images of 224 x 224 per rank from 6 pinned-memory "
                "workers, normalization on the GPU. Balanced ranks, busy GPUs, a small overlapped all-reduce: no "
                "warning is right.",
    },
    "naive_pipeline": {
        "verdict": "inefficient", "rank": None, "phase": "collective",
        "where": {0: "stage 0 (embeddings + layers 0-15): its forward, then idle in dist.recv of the activation gradient "
                     "while rank 1 runs its forward and backward, then its backward while rank 1 idles",
                  1: "stage 1 (layers 16-31 + LM head): idle in dist.recv of the activations while rank 0 runs its "
                     "forward, and again while rank 0 runs its backward"},
        "names": ["recv"],
        "fix": "pipeline micro-batches (GPipe / 1F1B: split the batch into 4 or more micro-batches so that both stages "
               "work at once, e.g. torch.distributed.pipelining's ScheduleGPipe), or train data-parallel (FSDP) "
               "instead of splitting the model by layers",
        "expected_gain": "about 1.5x (1.35x to 1.6x)",
        "note": "Hand-written two-stage model parallelism over dist.send/dist.recv with the whole batch as one "
                "micro-batch: only one GPU works at any time, each waits for the other about half of every step. "
                "Both ranks idle alike; neither is a straggler.",
    },
    "sorted_length_shards": {
        "verdict": "straggler", "rank": 1, "phase": "gpu",
        "where": {0: "waits for rank 1 in the DDP gradient all-reduce (in loss.backward(); on CUDA its CPU then waits "
                     "at the next host sync): its batches are short reviews",
                  1: "RoBERTa forward/backward on batches about three times as long as rank 0's (the long half of the "
                     "length-sorted corpus): the GPU is busy the whole step"},
        "names": [],
        "fix": "give the ranks batches of the same length at each step: shard the length-sorted corpus by interleaving "
               "(global batches of world x 64 similar-length reviews, rank r takes rows r::world, the batch order "
               "shuffled with a shared seed), or a DistributedSampler over length-grouped batches, not contiguous "
               "halves of the sorted list",
        "expected_gain": "about 1.45x (1.3x to 1.6x)",
        "note": "DDP with a hand-made length-sorted sharding: rank 0 trains on the short half of the corpus, rank 1 on "
                "the long half, so rank 1 is slower at every step (about 91 ms against 35 ms) and rank 0 waits in the "
                "all-reduce.",
    },
    "ddp_double_allreduce": {
        "verdict": "inefficient", "rank": None, "phase": "collective",
        "where": {0: "average_gradients after loss.backward(): one dist.all_reduce and one division per parameter "
                     "tensor (292, 1.42 GB of fp32 gradients), on top of DDP's own bucketed all-reduce; the GPU waits "
                     "on NCCL and the CPU issues small calls",
                  1: "the same"},
        "names": ["average_gradients", "all_reduce"],
        "fix": "drop the leftover average_gradients(model) call: DistributedDataParallel already averages the "
               "gradients (in buckets, overlapped with the backward)",
        "expected_gain": "about 1.2x (1.1x to 1.4x)",
        "note": "DDP GPT-2 medium with a leftover per-parameter gradient all-reduce from before DDP. Results are "
                "unchanged (averaging averaged gradients), so only the time shows it. Both ranks equal, no straggler.",
    },
}

import argparse
import math
import os
import sys
import threading
import time
from datetime import timedelta

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

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MODES = tuple(TRUTHS)
WARM_STEPS = 6          # steps before "rank R ready"


# --------------------------------------------------------------------------- what every job shares


def say(line: str) -> None:
    """One progress line on stdout, in a single write (the two ranks share the launcher's stdout)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Run:
    """One rank: where it runs, its sizes, its progress lines."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cuda = args.device == "cuda"
        self.tiny = args.tiny or not self.cuda
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.dev = torch.device("cuda", self.local) if self.cuda else torch.device("cpu")
        self.steps = 0
        self.samples = 0
        self._lock = threading.Lock()
        if self.rank == 0:
            threading.Thread(target=self._report, daemon=True, name="rate").start()

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.cuda)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def step_done(self, global_samples: int) -> None:
        """After each optimizer step: count it, and past the warm-up say so once."""
        with self._lock:
            self.steps += 1
            self.samples += global_samples
        if self.steps == WARM_STEPS:
            self.sync()
            say(f"rank {self.rank} ready")

    def _report(self) -> None:
        while True:
            time.sleep(RATE_EVERY_S)
            with self._lock:
                line = f"gputop-workload rate t={time.time():.3f} steps={self.steps} samples={self.samples}"
            say(line)


def ddp(run: Run, model: nn.Module, **kw) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = model.to(run.dev)
    return DDP(model, device_ids=[run.local] if run.cuda else None, **kw)


def adamw(run: Run, params, lr: float, **kw):
    if run.cuda:
        return torch.optim.AdamW(params, lr=lr, fused=True, **kw)
    return torch.optim.AdamW(params, lr=lr, **kw)


def hf_model(cls, cfg, device: torch.device | None = None, **kw):
    """A transformers model from its config (no download), SDPA attention where the version has it,
    its weights created (and initialized) on ``device``."""
    with torch.device(device or "cpu"):
        try:
            return cls(cfg, attn_implementation="sdpa", **kw)
        except (TypeError, ValueError):
            cfg._attn_implementation = "sdpa"
            try:
                return cls(cfg, **kw)
            except (TypeError, ValueError):
                cfg._attn_implementation = "eager"
                return cls(cfg, **kw)


def n_params(model: nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


# --------------------------------------------------------------------------- accelerate_vit: healthy


class ImageRows(torch.utils.data.Dataset):
    """Decoded training images (uint8, already resized) in memory, with their labels."""

    def __init__(self, n: int, size: int, classes: int, virtual_len: int = 4_000_000) -> None:
        g = torch.Generator().manual_seed(7)
        self.images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.virtual_len = virtual_len

    def __len__(self) -> int:
        return self.virtual_len

    def __getitem__(self, i: int):
        j = i % len(self.images)
        img = self.images[j]
        if (i // len(self.images)) % 2:
            img = img.flip(-1)  # random horizontal flip, as far as this corpus goes
        return img, self.labels[j]


def job_accelerate_vit(run: Run) -> None:
    from accelerate import Accelerator
    from transformers import ViTConfig, ViTForImageClassification

    accelerator = Accelerator(cpu=not run.cuda, mixed_precision="bf16" if run.cuda else "no")
    if run.tiny:
        cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, num_labels=10)
        batch, n_images, workers = 8, 256, 0
    else:  # vit-base-patch16-224
        cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, num_labels=1000)
        batch, n_images, workers = 128, 2048, 6
    model = hf_model(ViTForImageClassification, cfg)
    opt = adamw(run, model.parameters(), lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999))
    loader = torch.utils.data.DataLoader(ImageRows(n_images, cfg.image_size, cfg.num_labels), batch_size=batch,
                                         shuffle=True, drop_last=True, num_workers=workers, pin_memory=run.cuda,
                                         persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    mean = torch.tensor([0.5, 0.5, 0.5], device=accelerator.device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.5, 0.5, 0.5], device=accelerator.device).view(1, 3, 1, 1) * 255
    if accelerator.is_main_process:
        log(f"ViT {n_params(model):.0f}M parameters, {batch} images per rank, {run.world} processes, "
            f"mixed precision {accelerator.mixed_precision}")
    model.train()
    step = 0
    while True:
        for images, labels in loader:
            x = (images.float() - mean) / std
            logits = model(pixel_values=x).logits
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=0.1)
            accelerator.backward(loss)  # DDP: the gradient all-reduce runs in here
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            run.step_done(batch * run.world)
            if step % 100 == 0 and accelerator.is_main_process:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- naive_pipeline: one micro-batch


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class FirstHalf(nn.Module):
    """Stage 0: token and position embeddings and the first half of the layers."""

    def __init__(self, vocab: int, context: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return x


class SecondHalf(nn.Module):
    """Stage 1: the second half of the layers, the final norm, the LM head and the loss."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, self.vocab), targets.reshape(-1))


def init_gpt_(module: nn.Module, n_layer: int) -> None:
    for name, p in module.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight", "out.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)


def job_naive_pipeline(run: Run) -> None:
    assert run.world == 2, "two pipeline stages, one per rank"
    if run.tiny:
        vocab, context, d, n_layer, heads, batch = 1024, 64, 64, 4, 4, 8
    else:  # ~2.7B: width 2560, 32 layers
        vocab, context, d, n_layer, heads, batch = 50304, 2048, 2560, 32, 20, 8
    chunks = 4 if run.args.fixed else 1
    torch.manual_seed(0)
    with torch.device(run.dev):
        if run.rank == 0:
            stage = FirstHalf(vocab, context, d, n_layer // 2, heads)
        else:
            stage = SecondHalf(vocab, d, n_layer // 2, heads)
    init_gpt_(stage, n_layer)
    opt = adamw(run, stage.parameters(), lr=2e-4, weight_decay=0.1, betas=(0.9, 0.95))
    total = torch.tensor([n_params(stage)], device=run.dev)
    dist.all_reduce(total)
    if run.rank == 0:
        log(f"GPT {total.item():.0f}M parameters over 2 stages, {batch} x {context} tokens per step, "
            f"{chunks} micro-batch{'es' if chunks > 1 else ''}")
    # the same batches on both ranks: stage 0 needs the tokens, stage 1 the targets
    g = torch.Generator(device=run.dev).manual_seed(1234)
    data = [torch.randint(0, vocab, (batch, context + 1), device=run.dev, generator=g) for _ in range(4)]
    act_shape = (batch // chunks, context, d)
    step = 0
    while True:
        tokens = data[step % len(data)]
        ids, targets = tokens[:, :-1], tokens[:, 1:]
        if run.rank == 0:
            if chunks == 1:
                with run.autocast():
                    x = stage(ids)
                dist.send(x.detach().contiguous(), dst=1)
                grad = torch.empty_like(x)
                dist.recv(grad, src=1)
                x.backward(grad)
            else:  # GPipe: all forwards, each result sent as soon as it exists; backwards as gradients come back
                outs, sends = [], []
                for mb in ids.chunk(chunks):
                    with run.autocast():
                        x = stage(mb)
                    outs.append(x)
                    sends.append(dist.isend(x.detach().contiguous(), dst=1))
                grads = [torch.empty_like(x) for x in outs]
                recvs = [dist.irecv(gr, src=1) for gr in grads]
                for x, gr, rv in zip(outs, grads, recvs):
                    rv.wait()
                    x.backward(gr)
                for s in sends:
                    s.wait()
        else:
            if chunks == 1:
                act = torch.empty(act_shape, device=run.dev)
                dist.recv(act, src=0)
                act.requires_grad_()
                with run.autocast():
                    loss = stage(act, targets)
                loss.backward()
                dist.send(act.grad, dst=0)
            else:
                acts = [torch.empty(act_shape, device=run.dev) for _ in range(chunks)]
                recvs = [dist.irecv(a, src=0) for a in acts]
                sends = []
                for act, rv, tg in zip(acts, recvs, targets.chunk(chunks)):
                    rv.wait()
                    act.requires_grad_()
                    with run.autocast():
                        loss = stage(act, tg) / chunks
                    loss.backward()
                    sends.append(dist.isend(act.grad, dst=0))
                for s in sends:
                    s.wait()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        run.step_done(batch)  # both ranks work on the same batch
        if step % 20 == 0 and run.rank == 1:
            log(f"step {step}: loss {loss.item() * chunks:.4f}")


# --------------------------------------------------------------------------- sorted_length_shards: the long half on rank 1


def review_lengths(n: int, max_len: int, median: float, seed: int = 0) -> np.ndarray:
    """Token counts of the reviews (log-normal, cut at ``max_len`` by truncation)."""
    rng = np.random.default_rng(seed)
    raw = np.clip(rng.lognormal(np.log(median), 0.7, size=n), 16, 1.5 * max_len)
    return np.minimum(raw, max_len).astype(np.int64)


def contiguous_sorted_shard(lengths: np.ndarray, rank: int, world: int, batch: int, epoch: int) -> list[np.ndarray]:
    """As written: sort by length, this rank's contiguous part of the sorted list, batches of consecutive
    reviews, the batch order shuffled."""
    order = np.argsort(lengths, kind="stable")
    n = len(order) // world
    mine = order[rank * n:(rank + 1) * n]
    batches = [mine[i:i + batch] for i in range(0, len(mine) - batch + 1, batch)]
    rng = np.random.default_rng(1000 * epoch + rank)
    rng.shuffle(batches)
    return batches


def interleaved_sorted_shard(lengths: np.ndarray, rank: int, world: int, batch: int, epoch: int) -> list[np.ndarray]:
    """The fix: global batches of ``batch * world`` consecutive reviews of the sorted list, shuffled with a
    seed every rank shares; this rank takes rows ``rank::world`` of each."""
    order = np.argsort(lengths, kind="stable")
    g = batch * world
    global_batches = [order[i:i + g] for i in range(0, len(order) - g + 1, g)]
    rng = np.random.default_rng(1000 * epoch)
    rng.shuffle(global_batches)
    return [gb[rank::world] for gb in global_batches]


def job_sorted_length_shards(run: Run) -> None:
    from transformers import RobertaConfig, RobertaForSequenceClassification

    if run.tiny:
        cfg = RobertaConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=256, max_position_embeddings=130, num_labels=3)
        batch, max_len, median, n_reviews = 8, 128, 32, 2048
    else:  # roberta-large
        cfg = RobertaConfig(vocab_size=50265, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                            intermediate_size=4096, max_position_embeddings=514, num_labels=3)
        batch, max_len, median, n_reviews = 64, 512, 128, 40_960
    cfg.pad_token_id = 1
    model = ddp(run, hf_model(RobertaForSequenceClassification, cfg, run.dev))
    opt = adamw(run, model.parameters(), lr=1e-5, weight_decay=0.01)
    lengths = review_lengths(n_reviews, max_len, median)
    g = torch.Generator().manual_seed(5)
    corpus = torch.randint(3, cfg.vocab_size, (n_reviews, max_len), generator=g, dtype=torch.int32).to(run.dev)
    labels_all = torch.randint(0, cfg.num_labels, (n_reviews,), generator=g).to(run.dev)
    lengths_dev = torch.from_numpy(lengths).to(run.dev)
    shard = interleaved_sorted_shard if run.args.fixed else contiguous_sorted_shard
    if run.rank == 0:
        log(f"RoBERTa {n_params(model):.0f}M parameters, {batch} reviews per rank, {run.world} processes, "
            f"{'interleaved' if run.args.fixed else 'contiguous'} length-sorted shards")
    model.train()
    step, epoch = 0, 0
    while True:
        batches = shard(lengths, run.rank, run.world, batch, epoch)
        pad_lens = [int(-(-lengths[b].max() // 8) * 8) for b in batches]
        if epoch == 0:
            log(f"rank {run.rank}: {len(batches)} batches, mean padded length {np.mean(pad_lens):.0f}")
        for rows, pad_len in zip(batches, pad_lens):
            idx = torch.from_numpy(rows).to(run.dev, non_blocking=True)
            ids = corpus[idx, :pad_len].long()
            mask = torch.arange(pad_len, device=run.dev)[None, :] < lengths_dev[idx][:, None]
            ids = ids.masked_fill(~mask, cfg.pad_token_id)
            with run.autocast():
                logits = model(input_ids=ids, attention_mask=mask.long()).logits
            loss = F.cross_entropy(logits.float(), labels_all[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP: the gradient all-reduce runs in here
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            run.step_done(batch * run.world)
            if step % 100 == 0 and run.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")
        epoch += 1


# --------------------------------------------------------------------------- ddp_double_allreduce: a leftover


def average_gradients(model: nn.Module) -> None:
    """Gradient averaging from the tutorial's hand-made data parallelism (before DDP)."""
    world = float(dist.get_world_size())
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world


def job_ddp_double_allreduce(run: Run) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    if run.tiny:
        cfg = GPT2Config(vocab_size=1024, n_positions=256, n_embd=128, n_layer=4, n_head=4, bos_token_id=1023,
                         eos_token_id=1023)
        batch, seq = 4, 128
    else:  # gpt2-medium
        cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16)
        batch, seq = 8, 1024
    cfg.use_cache = False
    model = ddp(run, hf_model(GPT2LMHeadModel, cfg, run.dev))
    opt = adamw(run, model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))
    if run.rank == 0:
        n_tensors = sum(1 for _ in model.parameters())
        log(f"GPT-2 {n_params(model):.0f}M parameters in {n_tensors} tensors, {batch} x {seq} tokens per rank, "
            f"average_gradients {'removed' if run.args.fixed else 'after backward'}")
    g = torch.Generator(device=run.dev).manual_seed(run.rank)
    data = [torch.randint(0, cfg.vocab_size, (batch, seq), device=run.dev, generator=g) for _ in range(4)]
    step = 0
    while True:
        ids = data[step % len(data)]
        with run.autocast():
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: the gradient all-reduce runs in here
        if not run.args.fixed:
            average_gradients(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        run.step_done(batch * run.world)
        if step % 50 == 0 and run.rank == 0:
            log(f"step {step}: loss {loss.item():.4f}")


JOBS = {"accelerate_vit": job_accelerate_vit, "naive_pipeline": job_naive_pipeline,
        "sorted_length_shards": job_sorted_length_shards, "ddp_double_allreduce": job_ddp_double_allreduce}


# --------------------------------------------------------------------------- main


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
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    timeout = timedelta(seconds=args.seconds + 120)
    if args.device == "cuda":
        torch.cuda.set_device(local)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        try:
            dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local))
        except TypeError:  # PyTorch < 2.3
            dist.init_process_group("nccl", timeout=timeout)
    else:
        torch.set_num_threads(1)
        pin_to_own_core(int(os.environ.get("RANK", local)))
        dist.init_process_group("gloo", timeout=timeout)
    torch.manual_seed(0)
    run = Run(args)
    JOBS[args.job](run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
