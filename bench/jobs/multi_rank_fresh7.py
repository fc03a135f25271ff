"""Two-rank DDP training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh7.py \\
        --job MODE --device cuda|cpu [--fixed]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``, bf16 autocast), gloo on the CPU (small sizes, fp32,
one thread per rank, each rank on a core of its own where there are two). ``--fixed`` is the same
job once its user has fixed the problem; the bench compares the two by the samples/s rank 0 prints.
Plain PyTorch only: every model is built in code with random weights, every data set is generated
in memory. The CUDA sizes were checked on the CPU only (each model built at its CUDA size and run
forward and backward on a small batch, the multi-worker loaders run); no GPU was at hand.

The jobs, as their users would tell it (then what is really going on, and what ``--fixed`` should
gain; the CPU figures were measured on the 2-core machine these jobs were written on, see
``TRUTHS[mode]["measured_cpu"]``):

``ticket_router``
    A help-desk ticket classifier: a BERT-style encoder written with ``nn.TransformerEncoder``
    (vocabulary 30,522, 12 queues; CPU: width 256, 2 layers, 9.5M parameters, tickets of 64 tokens;
    CUDA: BERT-large shape, width 1024, 24 layers, 335M parameters, 256 tokens) fine-tuned with DDP
    and AdamW. Memory is tight, so the config says ``micro_batch=8, grad_accum_steps=8`` (CUDA:
    4 x 8): the loop runs forward and backward on each micro-batch with the loss divided by
    ``grad_accum_steps`` and steps the optimizer on every 8th.
    Truth: inefficient, no straggler. DDP all-reduces the gradients at the end of every backward,
    so all 8 micro-batches of an optimizer step pay a full all-reduce of every gradient (38 MB of
    fp32 on the CPU, 1.34 GB on CUDA; the token embedding alone is 82 % of it on the CPU) although
    only the last one is needed: both ranks wait in the collective 7 times too often. ``--fixed``:
    the first 7 micro-batches of each step run under ``model.no_sync()``, only the 8th all-reduces.
    Expected gain: on the CPU a 38 MB gloo all-reduce costs ~45-50 ms (measured here) against
    ~120 ms of compute per micro-batch: ~1.35x. On CUDA the 1.34 GB NCCL all-reduce (~4 ms at
    ~330 GB/s) is partly hidden behind each ~8-10 ms micro-batch backward: ~1.2-1.4x.

``tile_classifier``
    Land-use classification of 64 x 64 satellite tiles (EuroSAT-like, 10 classes) with a
    ResNet-style CNN written by hand (BatchNorm, 4 stages; CPU: width 16, one block per stage,
    0.3M parameters; CUDA: width 64, two blocks per stage, 11M parameters, channels_last), DDP,
    SGD with Nesterov momentum and a cosine schedule, label smoothing. Gradient accumulation over
    4 micro-batches (``accum=4`` in the config), done the way the DDP docs say: the first 3
    micro-batches under ``model.no_sync()``, the 4th synchronizes. Tiles are uint8 in memory,
    flipped and rotated in ``__getitem__``, a DistributedSampler shards them (6 workers on CUDA).
    Truth: healthy. Conv compute dominates (~170 ms per micro-batch of 16 on a CPU core); the
    1.2 MB (CPU) / 45 MB (CUDA) gradient all-reduce happens once per 4 micro-batches and overlaps
    the last backward; the ranks get the same amount of work. ``--fixed``: the same job.
    Expected gain: none (1.00x).

``code_lm``
    A small GPT for source code (plain PyTorch blocks, tied embeddings; CPU: width 256, 4 layers,
    8,192-token vocabulary, 5.3M parameters, 4 x 64 tokens per rank; CUDA: GPT-2-medium shape,
    24 layers, width 1024, 50,304 vocabulary, 355M parameters, 8 x 1024 tokens per rank)
    pre-trained with DDP, AdamW and gradient clipping. For the team's dashboard, rank 0 (the only
    process that talks to the tracker) logs ``layer_stats(model)`` after every backward: for every
    parameter tensor the weight and gradient norms, the largest gradient, the update-to-weight
    ratio and 64-bin histograms of the weights and of the gradients (what TensorBoard's
    ``add_histogram`` would get).
    Truth: straggler, rank 0. ``layer_stats`` reads every weight and every gradient several times
    per step (``torch.histc`` alone ~10 ns per element on a CPU core) and reads each result back
    with ``.item()``/``.tolist()`` (5 per tensor; on CUDA each one a host sync, ~1,500 per step),
    only on rank 0, between ``backward`` and ``opt.step()``. Rank 1 finishes its step and waits in
    the next step's DDP all-reduce (in ``loss.backward()``) for rank 0. ``--fixed``: the layer
    stats go out every 100 steps (``stats_every=100``), the scalars every step as before.
    Expected gain: CPU ~1.4-1.5x (~150 ms of stats for 5.3M parameters against a ~300 ms step,
    measured alone); CUDA ~1.4-1.8x (~1,500 syncs and ~3,000 small kernels, ~30-40 ms, against
    a ~60 ms step).

``demand_forecast``
    Hourly demand forecasting: a PatchTST-style Transformer (the week of history, 168 hours x 12
    features, cut into 14 patches of 12 hours; CPU: width 64, 2 layers; CUDA: width 512, 6
    layers) predicting the next 24 hours, DDP, AdamW, Huber loss, gradient clipping. Rank 0 hands a
    metrics row to a background ``MetricsWriter`` thread after every step (a bounded
    ``queue.Queue(maxsize=64)``, so that a slow disk cannot grow memory without end) that appends
    JSON lines to a file; every 4 seconds the row is a summary that also carries samples/s and
    the gradient norm. "A few seconds in, the job just stops: no error, no progress, both
    processes alive."
    Truth: stuck, rank 0. The gradient norm is the tensor ``clip_grad_norm_`` returns;
    ``json.dumps`` raises ``TypeError: Object of type Tensor is not JSON serializable`` in the writer
    thread at the first summary row, the thread dies (a traceback on stderr, nothing else), nobody
    drains the queue, and 64 rows later rank 0 blocks for ever in ``queue.Queue.put`` inside
    ``record_metrics``, between two steps; rank 1 waits for it in the next step's DDP gradient
    all-reduce (in ``loss.backward()``) for ever (the process-group timeout is longer than the
    job). ``--fixed``: the summary logs ``grad_norm.item()``; the writer lives, the job runs on.
    On the CPU it hangs ~5.5 s after the first step (after ~210 steps), ~10 s after launch.

``keyword_spotting``
    Spoken keyword spotting (Speech-Commands-like, 35 words, 1 s clips at 16 kHz held in memory as
    int16) with the DS-CNN of "Hello Edge" (CPU: 64 channels, 4 blocks, 25K parameters; CUDA: 276
    channels, 5 blocks), DDP, AdamW, OneCycle. ``__getitem__`` makes the features on the fly: a
    random time shift, room reverb half the time (FFT convolution with a random impulse response),
    background noise at a random SNR, a 40-band log-mel over 40 ms windows (``torch.stft``,
    hand-built filterbank), SpecAugment masks, 10 MFCCs (49 x 10). The author wanted both ranks to
    see disjoint halves of each shuffled global batch without thinking about samplers: every rank
    builds the same DataLoader (same seed, ``batch_size = per_rank_batch * world``) and keeps its
    slice, ``feats.chunk(world)[rank]``.
    Truth: inefficient, no straggler: each rank loads and featurizes the whole global batch and
    throws half of it away, so the feature pipeline (in the training process on the CPU; 4 workers
    per rank on CUDA) does twice the work it needs. ``--fixed``: a ``DistributedSampler`` (shared
    seed, ``set_epoch`` every epoch) with ``batch_size = per_rank_batch``; each rank loads only
    its own half. Expected gain: CPU ~1.4-1.6x (~1.5 ms of features per clip, 64 clips per rank,
    against ~40-60 ms of DS-CNN step); CUDA up to ~2x (the GPU step is a few ms, the 4 workers
    per rank are the bottleneck either way).

Every rank prints ``gputop-workload ready pid=P`` once past its warm-up (a few optimizer steps,
then a ``torch.cuda.synchronize()`` on CUDA): one line per rank, so two such lines mean both ranks
are training. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks; N: optimizer steps). Every process ends when its launcher dies or
after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "ticket_router": {
        "verdict": "inefficient", "rank": None, "phase": "collective",
        "where": {0: "loss.backward() of every micro-batch: DDP's gradient all-reduce (all ~38 MB of fp32 gradients, "
                     "mostly the token embedding) runs after each of the 8 accumulated micro-batches instead of only "
                     "the last, the rank waits in the collective",
                  1: "the same"},
        "names": ["no_sync"],
        "fix": "run the first grad_accum_steps - 1 micro-batches of every optimizer step under model.no_sync() "
               "(contextlib.nullcontext() for the last one), so DDP all-reduces once per optimizer step",
        "expected_gain": "about 1.4x on the CPU (1.25x to 1.6x); about 1.2-1.4x on CUDA",
        "measured_cpu": "1.40x (as-is 104.5 and 76.6, fixed 147.1 and 106.5 samples/s: two alternating pairs, 8 s"
                        " windows, load ~2.6 on the 2 cores); 1.56x with the machine busier (load ~6: medians of "
                        "3 pairs 48.9 -> 76.4 samples/s)",
        "note": "DDP gradient accumulation without no_sync(): 8 gradient all-reduces per optimizer step where 1 is "
                "needed. Both ranks do the same work and wait alike; neither is a straggler.",
    },
    "tile_classifier": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: CNN forward/backward on micro-batches of tiles, the first 3 of every 4 under "
                     "model.no_sync(), one small gradient all-reduce per optimizer step overlapped with the last "
                     "backward",
                  1: "the same"},
        "names": [],
        "fix": None,
        "expected_gain": "none (1.00x)",
        "measured_cpu": "0.95x, noise: as-is 255.8 and 247.3, --fixed (the same job) 243.1 and 234.6 samples/s "
                        "(load ~3); 114.8-174.7 and 110.3-131.8 samples/s with the machine busier (load ~6)",
        "note": "Gradient accumulation under DDP done right (no_sync on all but the last micro-batch), compute-bound, "
                "balanced ranks, data in memory: no warning is right.",
    },
    "code_lm": {
        "verdict": "straggler", "rank": 0, "phase": "cpu",
        "where": {0: "layer_stats(model) after loss.backward(), on rank 0 only: per parameter tensor weight/gradient "
                     "norms, max, update ratio and torch.histc histograms of weights and gradients, each read back "
                     "with .item()/.tolist()",
                  1: "waits for rank 0 in the next step's DDP gradient all-reduce (in loss.backward())"},
        "names": ["layer_stats"],
        "fix": "log the per-layer statistics every 100 steps (or off the training process), not every step: "
               "rank 0 then does the same work per step as rank 1",
        "expected_gain": "about 1.4x on the CPU (1.25x to 1.55x); about 1.4-1.8x on CUDA",
        "measured_cpu": "1.47x (as-is 38.4 and 34.1, fixed 53.3 and 53.3 samples/s: two alternating pairs, load "
                        "~2.5); 1.28x with the machine busier (load ~7: medians of 3 pairs 19.1 -> 24.5 "
                        "samples/s; when rank 1 idles other processes take its core)",
        "note": "Rank-0-only dashboard logging (per-layer norms and weight/gradient histograms) every step: rank 0 is "
                "slower at every step and rank 1 waits for it in the all-reduce.",
    },
    "demand_forecast": {
        "verdict": "stuck", "rank": 0, "phase": "cpu",
        "where": {0: "blocked for ever in queue.Queue.put (record_metrics): the MetricsWriter thread that drains the "
                     "bounded queue died on json.dumps of a tensor (the grad norm), the queue filled up",
                  1: "waits for ever in DDP's gradient all-reduce (in loss.backward()) for rank 0, which never "
                     "arrives"},
        "names": ["record_metrics", "put"],
        "fix": "log the gradient norm as a float (grad_norm.item()) so the writer thread does not die; also make "
               "record_metrics not block (put_nowait and drop, or check that the writer is alive)",
        "expected_gain": "no hang",
        "measured_cpu": "hangs ~5.5 s after the first training step (first step ~4.7 s after launch, last "
                        "progress ~10.3 s after launch, at step 205 and 222 in two runs), then no progress for "
                        "the 20-30 s left of each run; --fixed: 843 steps in 24 s (~2,300 samples/s), no hang",
        "note": "Rank 0's metrics-writer thread dies on an unserializable tensor; its bounded queue fills and "
                "rank 0's main thread blocks in put(); rank 1 hangs in the next all-reduce. No error, no timeout "
                "within the run.",
    },
    "keyword_spotting": {
        "verdict": "inefficient", "rank": None, "phase": "data",
        "where": {0: "the DataLoader's __getitem__ (reverb, noise mixing, torch.stft log-mel, SpecAugment, MFCC) "
                     "for the whole global batch of 2 x 64 clips, of which the rank keeps half "
                     "(feats.chunk(world)[rank])",
                  1: "the same"},
        "names": ["DistributedSampler"],
        "fix": "shard with a DistributedSampler (shared seed, set_epoch every epoch) and batch_size = the per-rank "
               "batch, instead of loading the global batch on every rank and slicing it",
        "expected_gain": "about 1.45x on the CPU (1.3x to 1.6x); up to about 2x on CUDA (data-bound)",
        "measured_cpu": "1.38x (as-is 561.4 and 562.9, fixed 749.8 and 801.3 samples/s: two alternating pairs, "
                        "load ~4); 1.55x with the machine busier (load ~6: medians of 3 pairs 382.3 -> 594.2 "
                        "samples/s)",
        "note": "Every rank loads and featurizes the full global batch and discards the other rank's half: twice "
                "the data work. Both ranks alike; no straggler.",
    },
}

import argparse
import contextlib
import json
import math
import os
import queue
import sys
import tempfile
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

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

MODES = tuple(TRUTHS)


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


# --------------------------------------------------------------------------- ticket_router


TICKET_CONFIG = {
    "cpu": {"vocab": 30522, "width": 256, "layers": 2, "heads": 4, "ffn": 1024, "max_len": 64,
            "micro_batch": 8, "grad_accum_steps": 8, "lr": 5e-5, "n_tickets": 4096},
    "cuda": {"vocab": 30522, "width": 1024, "layers": 24, "heads": 16, "ffn": 4096, "max_len": 256,
             "micro_batch": 4, "grad_accum_steps": 8, "lr": 2e-5, "n_tickets": 32768},
}
QUEUES = 12


class Tickets(Dataset):
    """Tokenized tickets (already padded to ``max_len`` with id 0, [CLS] = 101 first) and their queue."""

    def __init__(self, n: int, vocab: int, max_len: int, seed: int = 11) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(max_len // 4, max_len + 1, (n,), generator=g)
        ids = torch.randint(1000, vocab, (n, max_len), generator=g)
        ids[:, 0] = 101
        ids[torch.arange(max_len)[None, :] >= lengths[:, None]] = 0
        self.ids = ids
        self.queue = torch.randint(0, QUEUES, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self.ids[i], self.queue[i]


class TicketEncoder(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, ffn: int, max_len: int, n_out: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width, padding_idx=0)
        self.positions = nn.Embedding(max_len, width)
        self.emb_norm = nn.LayerNorm(width)
        layer = nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.1, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.classifier = nn.Sequential(nn.Dropout(0.1), nn.Linear(width, n_out))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.emb_norm(self.tokens(ids) + self.positions(pos))
        x = self.encoder(x, src_key_padding_mask=ids == 0)
        return self.classifier(self.pooler(x[:, 0]))


def job_ticket_router(t: Trainer) -> None:
    cfg = TICKET_CONFIG["cpu" if t.small else "cuda"]
    accum = cfg["grad_accum_steps"]
    t.warm_steps = 1
    model = TicketEncoder(cfg["vocab"], cfg["width"], cfg["layers"], cfg["heads"], cfg["ffn"], cfg["max_len"], QUEUES)
    model = t.wrap(model)
    opt = adamw(t, model.parameters(), lr=cfg["lr"], weight_decay=0.01)
    sched = warmup_cosine(opt, 100, 10_000)
    data = Tickets(cfg["n_tickets"], cfg["vocab"], cfg["max_len"])
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=cfg["micro_batch"], sampler=sampler, drop_last=True,
                        num_workers=0 if t.small else 2, pin_memory=t.cuda)
    if t.rank == 0:
        log(f"ticket encoder {count_params(model):.1f}M parameters, micro-batch {cfg['micro_batch']} x "
            f"{cfg['grad_accum_steps']} accumulation steps x {t.world} ranks")
    model.train()
    micro_samples = cfg["micro_batch"] * t.world
    step = 0
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for i, (ids, target) in enumerate(loader):
            ids = ids.to(t.dev, non_blocking=True)
            target = target.to(t.dev, non_blocking=True)
            boundary = (i + 1) % accum == 0
            if not t.fixed:
                with t.autocast():
                    logits = model(ids)
                loss = F.cross_entropy(logits.float(), target) / accum
                loss.backward()
            else:
                # accumulate locally; DDP all-reduces only on the micro-batch that ends the optimizer step
                with contextlib.nullcontext() if boundary else model.no_sync():
                    with t.autocast():
                        logits = model(ids)
                    loss = F.cross_entropy(logits.float(), target) / accum
                    loss.backward()
            if boundary:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if step % 20 == 0 and t.rank == 0:
                    log(f"step {step}: loss {loss.item() * accum:.4f}")
            t.trained(micro_samples, optimizer_step=boundary)


# --------------------------------------------------------------------------- tile_classifier


class Tiles(Dataset):
    """64 x 64 RGB tiles (uint8, in memory) with their land-use class; random flips and 90-degree turns."""

    def __init__(self, n: int, size: int = 64, classes: int = 10, seed: int = 3) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.rng = torch.Generator().manual_seed(seed + 1)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = self.images[i]
        k, flip = torch.randint(0, 4, (2,), generator=self.rng).tolist()
        if flip % 2:
            img = img.flip(-1)
        return torch.rot90(img, k, (1, 2)), self.labels[i]


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x), inplace=True)


class TileNet(nn.Module):
    def __init__(self, width: int, blocks: int, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True))
        layers, cin = [], width
        for stage, mult in enumerate((1, 2, 4, 8)):
            for b in range(blocks):
                layers.append(ResidualBlock(cin, width * mult, 2 if (b == 0 and stage > 0) else 1))
                cin = width * mult
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.body(self.stem(x)), 1), 1))


def job_tile_classifier(t: Trainer) -> None:
    cfg = {"width": 16, "blocks": 1, "micro_batch": 16, "accum": 4, "n_tiles": 2048, "workers": 0} if t.small else \
          {"width": 64, "blocks": 2, "micro_batch": 128, "accum": 4, "n_tiles": 16384, "workers": 6}
    t.warm_steps = 2
    model = TileNet(cfg["width"], cfg["blocks"])
    if t.cuda:
        model = model.to(memory_format=torch.channels_last)
    model = t.wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20_000)
    data = Tiles(cfg["n_tiles"])
    sampler = DistributedSampler(data, shuffle=True, seed=42, drop_last=True)
    loader = DataLoader(data, batch_size=cfg["micro_batch"], sampler=sampler, drop_last=True,
                        num_workers=cfg["workers"], pin_memory=t.cuda, persistent_workers=cfg["workers"] > 0)
    mean = torch.tensor([0.34, 0.38, 0.41], device=t.dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.20, 0.14, 0.12], device=t.dev).view(1, 3, 1, 1) * 255
    if t.rank == 0:
        log(f"TileNet {count_params(model):.2f}M parameters, {cfg['micro_batch']} tiles x {cfg['accum']} micro-batches "
            f"per step per rank")
    accum = cfg["accum"]
    model.train()
    step = 0
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for i, (images, labels) in enumerate(loader):
            images = images.to(t.dev, non_blocking=True)
            labels = labels.to(t.dev, non_blocking=True)
            x = (images.float() - mean) / std
            if t.cuda:
                x = x.contiguous(memory_format=torch.channels_last)
            last = (i + 1) % accum == 0
            # DDP docs: skip the gradient all-reduce on all but the last micro-batch of a step
            ctx = contextlib.nullcontext() if last else model.no_sync()
            with ctx:
                with t.autocast():
                    logits = model(x)
                loss = F.cross_entropy(logits.float(), labels, label_smoothing=0.1) / accum
                loss.backward()
            if last:
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if step % 25 == 0 and t.rank == 0:
                    log(f"step {step}: loss {loss.item() * accum:.4f}")
            t.trained(cfg["micro_batch"] * t.world, optimizer_step=last)


# --------------------------------------------------------------------------- code_lm


class CausalBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.o = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, n, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class CodeGPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(ctx, width))
        self.blocks = nn.ModuleList(CausalBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.tok.weight  # tied
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.01)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def layer_stats(model: nn.Module, lr: float) -> dict:
    """What the dashboard shows per layer: norms, update ratio, and weight / gradient histograms."""
    stats = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        w, g = p.detach(), p.grad.detach()
        w_norm = w.norm().item()
        g_norm = g.norm().item()
        stats[f"{name}/weight_norm"] = w_norm
        stats[f"{name}/grad_norm"] = g_norm
        stats[f"{name}/grad_max"] = g.abs().max().item()
        stats[f"{name}/update_ratio"] = lr * g_norm / (w_norm + 1e-12)
        stats[f"{name}/weight_hist"] = torch.histc(w.float(), bins=64).tolist()
        stats[f"{name}/grad_hist"] = torch.histc(g.float(), bins=64).tolist()
    return stats


class Tracker:
    """Stand-in for the experiment tracker client: keeps the last rows in memory."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, row: dict, step: int) -> None:
        self.rows.append({"step": step, **row})
        del self.rows[:-50]


def job_code_lm(t: Trainer) -> None:
    if t.small:
        cfg = {"vocab": 8192, "ctx": 64, "width": 256, "layers": 4, "heads": 4, "batch": 4}
    else:  # GPT-2 medium shape
        cfg = {"vocab": 50304, "ctx": 1024, "width": 1024, "layers": 24, "heads": 16, "batch": 8}
    stats_every = 100 if t.fixed else 1
    lr = 3e-4
    model = t.wrap(CodeGPT(cfg["vocab"], cfg["ctx"], cfg["width"], cfg["layers"], cfg["heads"]))
    opt = adamw(t, model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    sched = warmup_cosine(opt, 200, 50_000)
    tracker = Tracker() if t.rank == 0 else None
    # token stream of the rank's shard of the corpus, cut into windows
    g = torch.Generator().manual_seed(100 + t.rank)
    stream = torch.randint(0, cfg["vocab"], (cfg["batch"] * 64 * (cfg["ctx"] + 1),), generator=g)
    windows = stream.view(-1, cfg["ctx"] + 1)
    loader = DataLoader(windows, batch_size=cfg["batch"], shuffle=True, drop_last=True, pin_memory=t.cuda)
    if t.rank == 0:
        log(f"code GPT {count_params(model):.1f}M parameters, {cfg['batch']} x {cfg['ctx']} tokens per rank, "
            f"layer stats every {stats_every} step(s)")
    model.train()
    step = 0
    while True:
        for chunk in loader:
            chunk = chunk.to(t.dev, non_blocking=True)
            with t.autocast():
                loss = model(chunk[:, :-1], chunk[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP: the gradient all-reduce runs in here
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if t.rank == 0:
                row = {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": sched.get_last_lr()[0]}
                if step % stats_every == 0:
                    row.update(layer_stats(model.module, sched.get_last_lr()[0]))
                tracker.log(row, step)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 50 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- demand_forecast


class MetricsWriter(threading.Thread):
    """Appends metrics rows as JSON lines from a background thread, so that the training loop never
    waits for the disk. The queue is bounded: a stalled disk must not grow memory without end."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(name="metrics-writer", daemon=True)
        self.rows: queue.Queue = queue.Queue(maxsize=maxsize)
        self.out = tempfile.TemporaryFile("w+")  # stands for runs/<name>/metrics.jsonl
        self.written = 0

    def record_metrics(self, row: dict) -> None:
        self.rows.put(row)

    def run(self) -> None:
        while True:
            row = self.rows.get()
            self.out.write(json.dumps(row) + "\n")
            self.written += 1
            if self.written % 100 == 0:
                self.out.flush()


class PatchForecaster(nn.Module):
    """PatchTST-style: the history cut into patches of 12 hours, one token each, a Transformer encoder over
    the patches, a linear head from the flattened tokens to the horizon."""

    def __init__(self, features: int, width: int, layers: int, heads: int, history: int, horizon: int,
                 patch: int = 12) -> None:
        super().__init__()
        self.patch = patch
        n_patches = history // patch
        self.embed = nn.Linear(patch * features, width)
        self.pos = nn.Parameter(torch.randn(n_patches, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Flatten(1), nn.Dropout(0.1), nn.Linear(n_patches * width, horizon))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, hours, f = x.shape
        tokens = self.embed(x.reshape(b, hours // self.patch, self.patch * f)) + self.pos
        return self.head(self.encoder(tokens))


class DemandWindows(Dataset):
    """Sliding windows over the hourly series of many sites: 168 hours of 12 features in, the next 24 hours of
    demand out."""

    def __init__(self, sites: int, hours: int, features: int, history: int, horizon: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        tt = torch.arange(hours, dtype=torch.float32)
        daily = torch.sin(2 * math.pi * tt / 24)[None, :, None]
        weekly = torch.sin(2 * math.pi * tt / 168)[None, :, None]
        self.series = daily + 0.5 * weekly + 0.3 * torch.randn(sites, hours, features, generator=g)
        self.history, self.horizon = history, horizon
        self.per_site = hours - history - horizon

    def __len__(self) -> int:
        return self.series.shape[0] * self.per_site

    def __getitem__(self, i: int):
        site, start = divmod(i, self.per_site)
        s = self.series[site]
        x = s[start:start + self.history]
        y = s[start + self.history:start + self.history + self.horizon, 0]
        return x, y


def job_demand_forecast(t: Trainer) -> None:
    cfg = {"features": 12, "history": 168, "horizon": 24, "queue_size": 64, "summary_every_s": 4.0}
    if t.small:
        cfg.update(width=64, layers=2, heads=4, batch=32, sites=64, hours=2000)
    else:
        cfg.update(width=512, layers=6, heads=8, batch=256, sites=256, hours=4000)
    model = t.wrap(PatchForecaster(cfg["features"], cfg["width"], cfg["layers"], cfg["heads"], cfg["history"],
                                   cfg["horizon"]))
    opt = adamw(t, model.parameters(), lr=1e-3, weight_decay=1e-4)
    data = DemandWindows(cfg["sites"], cfg["hours"], cfg["features"], cfg["history"], cfg["horizon"], seed=5)
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=cfg["batch"], sampler=sampler, drop_last=True,
                        num_workers=0 if t.small else 4, pin_memory=t.cuda, persistent_workers=not t.small)
    writer = None
    if t.rank == 0:
        writer = MetricsWriter(maxsize=cfg["queue_size"])
        writer.start()
        log(f"forecaster {count_params(model):.2f}M parameters, {cfg['batch']} windows per rank")
    model.train()
    step = 0
    t0 = last_summary = time.time()
    seen_since = 0
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x = x.to(t.dev, non_blocking=True)
            y = y.to(t.dev, non_blocking=True)
            with t.autocast():
                pred = model(x)
            loss = F.huber_loss(pred.float(), y, delta=1.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP: the gradient all-reduce runs in here
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            step += 1
            seen_since += cfg["batch"] * t.world
            if writer is not None:
                now = time.time()
                row = {"step": step, "epoch": epoch, "loss": loss.item(), "elapsed": now - t0}
                if now - last_summary >= cfg["summary_every_s"]:  # a summary row every few seconds
                    row["samples_per_s"] = seen_since / (now - last_summary)
                    row["grad_norm"] = grad_norm.item() if t.fixed else grad_norm
                    last_summary, seen_since = now, 0
                writer.record_metrics(row)
            t.trained(cfg["batch"] * t.world)
            if step % 200 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- keyword_spotting


SAMPLE_RATE = 16_000
WORDS = 35


def mel_filterbank(n_fft: int, n_mels: int, sr: int, fmin: float = 20.0, fmax: float = 7600.0) -> torch.Tensor:
    def hz_to_mel(f):
        return 2595.0 * math.log10(1.0 + f / 700.0)

    mels = torch.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    bins = torch.linspace(0, sr / 2, n_fft // 2 + 1)
    lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (bins[None, :] - lo) / (mid - lo)
    down = (hi - bins[None, :]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0.0)  # (n_mels, n_fft // 2 + 1)


def dct_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """Orthonormal DCT-II, (n_out, n_in): log-mel energies to MFCCs."""
    k = torch.arange(n_out, dtype=torch.float32)[:, None]
    n = torch.arange(n_in, dtype=torch.float32)[None, :]
    m = torch.cos(math.pi / n_in * (n + 0.5) * k) * math.sqrt(2.0 / n_in)
    m[0] /= math.sqrt(2.0)
    return m


class SpokenWords(Dataset):
    """1 s clips (int16 in memory) and their word. Features made on the fly, as in 'Hello Edge': time shift, room
    reverb (a random impulse response, FFT convolution), background noise at a random SNR, 40-band log-mel over
    40 ms windows with a 20 ms hop, SpecAugment masks, 10 MFCCs: a 49 x 10 input per clip."""

    def __init__(self, n_clips: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        t = torch.arange(SAMPLE_RATE) / SAMPLE_RATE
        f0 = torch.randint(120, 400, (n_clips, 1), generator=g).float()
        env = torch.exp(-((t[None, :] - 0.5) ** 2) / 0.02)
        voiced = torch.sin(2 * math.pi * f0 * t) + 0.3 * torch.sin(6 * math.pi * f0 * t)
        clips = env * voiced + 0.05 * torch.randn(n_clips, SAMPLE_RATE, generator=g)
        self.clips = (clips / clips.abs().amax(1, keepdim=True) * 20000).to(torch.int16)
        self.noise = (torch.randn(6, 10 * SAMPLE_RATE, generator=g) * 3000).to(torch.int16)  # background tracks
        taps = torch.arange(SAMPLE_RATE // 4) / SAMPLE_RATE
        decay = torch.rand(16, 1, generator=g) * 0.15 + 0.05  # RT60-ish 0.05-0.2 s
        self.rirs = torch.randn(16, taps.numel(), generator=g) * torch.exp(-6.9 * taps / decay)
        self.rirs[:, 0] = 1.0
        self.rirs /= self.rirs.norm(dim=1, keepdim=True)
        self.labels = torch.randint(0, WORDS, (n_clips,), generator=g)
        self.win, self.hop = 640, 320
        self.window = torch.hann_window(self.win)
        self.mel = mel_filterbank(self.win, 40, SAMPLE_RATE)
        self.dct = dct_matrix(40, 10)
        self.rng = torch.Generator().manual_seed(seed + 1)

    def __len__(self) -> int:
        return len(self.clips)

    def reverb(self, wave: torch.Tensor, rir: torch.Tensor) -> torch.Tensor:
        n = wave.numel() + rir.numel()
        wet = torch.fft.irfft(torch.fft.rfft(wave, n) * torch.fft.rfft(rir, n), n)[: wave.numel()]
        return wet * (wave.norm() / (wet.norm() + 1e-8))

    def __getitem__(self, i: int):
        r = torch.rand(8, generator=self.rng).tolist()
        wave = self.clips[i].float() / 32768.0
        wave = torch.roll(wave, int((r[0] - 0.5) * 0.2 * SAMPLE_RATE))  # +-100 ms shift
        if r[6] < 0.5:
            wave = self.reverb(wave, self.rirs[int(r[7] * len(self.rirs))])
        track = self.noise[int(r[1] * len(self.noise))].float() / 32768.0
        start = int(r[2] * (track.numel() - SAMPLE_RATE))
        noise = track[start:start + SAMPLE_RATE]
        snr_db = 5 + 15 * r[3]
        scale = wave.pow(2).mean().sqrt() / (noise.pow(2).mean().sqrt() * 10 ** (snr_db / 20) + 1e-8)
        wave = wave + scale * noise
        spec = torch.stft(wave, n_fft=self.win, hop_length=self.hop, window=self.window, center=False,
                          return_complex=True)
        power = spec.abs().pow(2)  # (321, 49)
        logmel = torch.log(self.mel @ power + 1e-6)  # (40, 49)
        f0 = int(r[4] * 32)
        logmel[f0:f0 + 8] = logmel.mean()  # frequency mask
        t0 = int(r[5] * 40)
        logmel[:, t0:t0 + 8] = logmel.mean()  # time mask
        mfcc = (self.dct @ logmel).T  # (49, 10)
        return mfcc.unsqueeze(0), self.labels[i]


class DSCNN(nn.Module):
    """Depthwise-separable CNN for keyword spotting (Zhang et al., 'Hello Edge')."""

    def __init__(self, channels: int, blocks: int, classes: int = WORDS) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, (10, 4), stride=(2, 2), padding=(5, 1), bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU(inplace=True))
        layers = []
        for _ in range(blocks):
            layers += [nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
                       nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                       nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.body(self.stem(x)), 1), 1))


def job_keyword_spotting(t: Trainer) -> None:
    if t.small:
        cfg = {"per_rank_batch": 64, "channels": 64, "blocks": 4, "clips": 2048, "workers": 0}
    else:
        cfg = {"per_rank_batch": 256, "channels": 276, "blocks": 5, "clips": 4096, "workers": 4}
    model = t.wrap(DSCNN(cfg["channels"], cfg["blocks"]))
    opt = adamw(t, model.parameters(), lr=2e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=100_000)
    data = SpokenWords(cfg["clips"])
    batch = cfg["per_rank_batch"]
    if t.rank == 0:
        log(f"DS-CNN {count_params(model):.2f}M parameters, {batch} clips per rank, {cfg['workers']} loader workers")
    if not t.fixed:
        # the same shuffle on every rank (same seed); each rank keeps its own part of every global batch
        sampler = None
        shuffle = torch.Generator().manual_seed(1234)
        loader = DataLoader(data, batch_size=batch * t.world, shuffle=True, generator=shuffle, drop_last=True,
                            num_workers=cfg["workers"], pin_memory=t.cuda, persistent_workers=cfg["workers"] > 0)
    else:
        sampler = DistributedSampler(data, num_replicas=t.world, rank=t.rank, shuffle=True, seed=1234, drop_last=True)
        loader = DataLoader(data, batch_size=batch, sampler=sampler, drop_last=True, num_workers=cfg["workers"],
                            pin_memory=t.cuda, persistent_workers=cfg["workers"] > 0)
    model.train()
    step = 0
    for epoch in range(10**6):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for feats, labels in loader:
            if not t.fixed:
                feats = feats.chunk(t.world)[t.rank]
                labels = labels.chunk(t.world)[t.rank]
            feats = feats.to(t.dev, non_blocking=True)
            labels = labels.to(t.dev, non_blocking=True)
            with t.autocast():
                logits = model(feats)
            loss = F.cross_entropy(logits.float(), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP: the gradient all-reduce runs in here
            opt.step()
            sched.step()
            step += 1
            t.trained(batch * t.world)
            if step % 50 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


JOBS = {"ticket_router": job_ticket_router, "tile_classifier": job_tile_classifier, "code_lm": job_code_lm,
        "demand_forecast": job_demand_forecast, "keyword_spotting": job_keyword_spotting}


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
        torch.backends.cudnn.benchmark = True
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
