"""Two-rank training jobs (DDP, one hand-rolled tensor-parallel), each with one known problem (or none), started
the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh13.py \\
        --job MODE --device cuda|cpu [--fixed] [--seconds N]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``, bf16 autocast), gloo on the CPU (small sizes, fp32, one
thread per rank, each rank on a core of its own where there are two). ``--fixed`` is the same job once its
user has fixed the problem; the bench compares the two by the samples/s rank 0 prints (the hang,
``grid_load``, has a ``--fixed`` too, which simply keeps training). Plain PyTorch only (and ``filelock``,
which torch itself depends on): every model is built in code with random weights, every data set is
generated in memory. The CUDA sizes were reasoned out, not run: no GPU was at hand.

The jobs, as their users would tell it (then what is really going on, and what ``--fixed`` should
gain; CPU figures in ``TRUTHS[mode]["measured_cpu"]`` come from a shared 2-core machine under load
from other work, where pairs of runs of one and the same job differ by tens of percent on their own):

``crop_yield``
    Crop-yield regression from a season of satellite composites (36 dates x 16 band and weather
    features per field): an 8-layer temporal Transformer of width 384 (CPU: width 64, 2 layers, 32
    fields per rank; CUDA: 14M parameters, 512 fields per rank), DDP, fused AdamW, clipping; the fields
    live on the device. Rank 0 also feeds the team's live dashboard: the loop posts a small record every
    step to a ``StatusBoard`` whose thread (``status-board``) appends them to a JSON-lines file. "Rank 1's
    GPU is idle a third of the time; both GPUs are well under their usual load for a model this size."
    Truth: straggler, rank 0, phase ``host``. The board's thread drains a ``collections.deque`` by
    polling it in a ``while True`` loop with no sleep, so on rank 0 a pure-Python thread is always
    runnable and contends for the GIL with the training thread: rank 0's Python and kernel-launch work
    gets the GIL about half the time (each wait up to the 5 ms switch interval), and every time the
    training thread gives the GIL up (inside ``loss.backward()``, ``.item()``) it waits ~5 ms to get it
    back. Rank 0's host becomes the bottleneck; rank 1 finishes its GPU work and waits in DDP's gradient
    all-reduce for rank 0 every step. ``--fixed``: the board uses a ``queue.Queue`` and its thread sleeps
    in a blocking ``get()``. Expected gain on CUDA: ~2x (1.5x-3x).

``grid_load``
    Day-ahead load forecasting for grid substations: a 6-layer Transformer encoder of width 512 over a
    week of hourly readings (CPU: width 64, 2 layers, 16 x 48 h per rank; CUDA: 21M parameters, 256 x
    168 h per rank), DDP, fused AdamW. Every 200 steps (CPU: 50) each rank appends a line with its loss
    and the loss averaged over the ranks to the run's shared ``metrics.csv``, under a ``FileLock`` so that
    the ranks' lines do not interleave. "It trains for a few seconds, then both GPUs go quiet and nothing
    more is printed; no error."
    Truth: stuck at the first metrics step. ``append_metrics`` takes the file lock and only then calls
    ``dist.all_reduce`` for the mean loss: whichever rank gets the lock first enters the all-reduce and
    waits for the other rank, which is polling for the lock that the first rank will never release
    (``FileLock.acquire`` sleeps 50 ms between tries). A lock-order deadlock between a cross-process file
    lock and a collective; no NCCL error (the watchdog's timeout is the job's length plus two minutes).
    ``--fixed``: the all-reduce first, on every rank, then the lock only around the write.

``recipe_lm``
    Pretraining a 336M-parameter decoder on recipe text (CPU: width 64, 2 layers, 8 x 64 tokens; CUDA:
    24 layers, width 1,024, vocabulary 32,000, 16 x 1,024 tokens per step). The parallel layout comes
    from the team's 7B recipe: Megatron-style tensor parallelism over the node's GPUs (``TPBlock`` with
    ``ColumnParallelLinear`` / ``RowParallelLinear``, all-reduces in ``_ReduceFromTP`` and
    ``_CopyToTP``), both ranks on the same 16 sequences. "Two H200s and the step is hardly faster than
    on one."
    Truth: inefficient, both ranks alike, phase ``comm``. The model (~5 GB with its AdamW states, ~20 GB
    of activations) fits on one GPU with room to spare, yet each layer does two all-reduces of the
    [16,384 x 1,024] activations in the forward and two of their gradients in the backward (96 a step,
    32 MB each, on the critical path: nothing overlaps them), and the replicated parts (embedding and
    tied LM head over all 16,384 tokens, LayerNorms, residuals, the loss) are computed in full on both
    ranks. ``--fixed``: plain DDP, the full model on each GPU, each rank on 8 of the 16 sequences (the same
    global batch); one gradient all-reduce per step, overlapped with the backward. Expected gain on CUDA:
    ~1.45x (1.25x-1.8x).

``chest_xray``
    Multi-label findings on chest radiographs (14 findings): a ResNet-50-shaped CNN built in code (CPU:
    width 16, one block per stage, 16 films of 32 px per rank; CUDA: 23.5M parameters, 128 films of 224 px
    per rank), channels_last, bf16, DDP, SGD with Nesterov momentum; the films (uint8) live on the device.
    Truth: healthy: conv-bound (~3 TFLOP per rank per step, ~45 ms on an H100), one ~94 MB fp32
    gradient all-reduce overlapped with the backward, balanced ranks. ``--fixed``: the same job. Expected
    gain: none (1.00x).

Every rank prints ``gputop-workload ready pid=P`` once past its warm-up (a few optimizer steps,
then a ``torch.cuda.synchronize()`` on CUDA): one line per rank, so two such lines mean both ranks
are training. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks; N: optimizer steps). Every process ends when its launcher dies (also
one killed while the process was still importing) or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "crop_yield": {
        "verdict": "straggler", "rank": 0, "phase": "host",
        "where": {0: "StatusBoard._drain (thread 'status-board', started only on rank 0) spins in `while True: while "
                     "self.pending: ...` over a collections.deque with no sleep: a pure-Python thread always "
                     "runnable, contending for the GIL with the training thread, whose Python and kernel launches "
                     "get the GIL about half the time and which waits ~5 ms (the switch interval) to get it back "
                     "after each release (loss.backward(), .item()); rank 0's host is the bottleneck, its GPU "
                     "partly idle",
                  1: "trains; every step its GPU finishes early and it waits in DDP's gradient all-reduce (NCCL: "
                     "GPU in the all-reduce kernel; gloo: host inside loss.backward()) for rank 0, whose host is "
                     "late issuing the same step"},
        "names": ["StatusBoard", "_drain", "status-board", "collections.deque", "popleft", "job_crop_yield"],
        "fix": "let the board's thread sleep until there is work: a queue.Queue with a blocking get() (what --fixed "
               "does), or at least a sleep in the polling loop; or write the status from the training loop every "
               "N steps",
        "expected_gain": "about 2x on CUDA (1.5x-3x): fixed, a step per rank is ~1.6 TFLOP of bf16 matmuls over "
                         "18,432 tokens of width 384 (~4.5 ms), LayerNorm/GELU/residual traffic (~10 GB, ~3.5 ms) "
                         "and a 57 MB gradient all-reduce overlapped: ~8.5-9 ms of GPU work against ~5.5 ms of host "
                         "work (~3.7 ms of it under the GIL: ~250 Python-level op calls and launches; the rest in "
                         "the autograd engine, which runs without the GIL). As-is rank 0's GIL-bound host work runs "
                         "~3x slower (~11-12 ms; a busy Python thread took a CPU torch op from 4 to 14.5 us here) "
                         "plus ~5 ms to retake the GIL after loss.backward() plus the engine's ~2 ms: ~18-19 ms a "
                         "step, which rank 1 waits for: 18.5 / 9 = ~2x",
        "measured_cpu": "one 25 s pair under load: as-is 232 steps, --fixed 467 (2.0x); on the CPU the polling "
                        "thread also shares rank 0's one core, so there the straggle is partly plain CPU time",
        "note": "A busy-wait (polling) consumer thread in the main process of one rank: GIL contention slows that "
                "rank's host side only, and the other rank pays for it in its next collective. Not a data, "
                "communication or GPU-kernel problem.",
        "script": "multi_rank_fresh13.py",
    },
    "grid_load": {
        "verdict": "stuck", "rank": None, "phase": "comm",
        "where": {0: "in append_metrics at the first metrics step (step 200 on CUDA, 50 on the CPU), one of two "
                     "places, whichever rank took the file lock first: holding FileLock(metrics.csv.lock) and "
                     "waiting in dist.all_reduce(mean) for the other rank (NCCL: its GPU spins in the all-reduce "
                     "kernel and its host blocks in local_loss.item(); gloo: its host blocks in all_reduce), or "
                     "polling FileLock.acquire (sleeping 50 ms between tries), its GPU idle, never reaching the "
                     "all-reduce",
                  1: "the other of the two"},
        "names": ["append_metrics", "FileLock", "metrics.csv.lock", "log_every", "job_grid_load"],
        "fix": "all-reduce first, on every rank, outside the lock, and hold the lock only for the write (what "
               "--fixed does); or let rank 0 alone write the file",
        "expected_gain": "from no progress at all to training: the rates stop advancing at the first metrics step "
                         "as-is",
        "measured_cpu": "as-is the rate lines stop at steps=50 about 3 s after start and stay there for the rest "
                        "of the run (both ready lines printed first; in that run rank 1 had taken the lock and "
                        "waited in the all-reduce); --fixed kept training (185 steps in 10 s) and wrote both ranks' "
                        "lines every 50 steps",
        "note": "A collective called while holding a lock that the other rank needs before it can reach the same "
                "collective: a lock-order deadlock across processes, not a straggler. Which rank ends up inside "
                "the all-reduce is a race (the one that took the lock first); neither is slow.",
        "script": "multi_rank_fresh13.py",
    },
    "recipe_lm": {
        "verdict": "inefficient", "rank": None, "phase": "comm",
        "where": {0: "tensor parallelism over both GPUs for a model that fits on one: _ReduceFromTP (after "
                     "RowParallelLinear proj and fc_proj) all-reduces the [16 x 1,024 x 1,024] activations twice "
                     "per layer in the forward, _CopyToTP (before ColumnParallelLinear qkv and fc) their gradients "
                     "twice per layer in the backward: 96 blocking 32 MB all-reduces a step on the critical path; "
                     "the embedding, the tied LM head, the LayerNorms, residuals and the cross entropy computed in "
                     "full on both ranks",
                  1: "the same (both ranks process the same 16 sequences)"},
        "names": ["ColumnParallelLinear", "RowParallelLinear", "_ReduceFromTP", "_CopyToTP", "TPBlock",
                  "job_recipe_lm"],
        "fix": "data parallel instead (what --fixed does): DDP with the full 336M-parameter model on each GPU (~5 GB "
               "of weights, gradients and AdamW states, ~10 GB of activations for 8 sequences), each rank on half "
               "the batch, one gradient all-reduce overlapped with the backward",
        "expected_gain": "about 1.45x on CUDA (1.25x-1.8x): as-is each rank does half the block matmuls of 16,384 "
                         "tokens (14.8 TFLOP) plus the full tied LM head (3.2 TFLOP): ~33 ms at ~550 TFLOPS, flash "
                         "attention over its 8 heads (~4 ms), all the LayerNorm/residual/cast traffic in full "
                         "(~66 GB, ~22 ms on an H100), the full cross entropy over 16,384 x 32,000 logits (~4 ms), "
                         "96 exposed all-reduces of 32 MB (~0.1 ms each over NVLink, ~10 ms) and AdamW (~2.5 ms): "
                         "~75 ms per 16 sequences. Fixed each rank does 8 sequences with the full model: 16.4 TFLOP "
                         "(~30 ms), attention ~4 ms, half the elementwise traffic (~11 ms) and of the loss (~2 ms), "
                         "AdamW and clipping over 336M parameters (~4.6 ms), the 1.3 GB gradient all-reduce hidden "
                         "behind the backward but its last bucket (~0.5 ms): ~52 ms. 75 / 52 = 1.45x (an H200's "
                         "faster memory: ~67 against ~47 ms, 1.43x)",
        "measured_cpu": "one 25 s pair under load: as-is 307 steps, --fixed 642 (2.1x): over gloo the 96 "
                        "activation all-reduces a step cost far more than over NVLink; the CUDA ratio rests on "
                        "the reasoning above",
        "note": "Model parallelism where data parallelism fits: the per-layer activation all-reduces sit between "
                "the layers' matmuls and nothing hides them, and the non-sharded work is done twice. Both ranks "
                "alike; not a straggler, not a data problem.",
        "script": "multi_rank_fresh13.py",
    },
    "chest_xray": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: a ResNet-50-shaped CNN in bf16 and channels_last on device-resident films, one gradient "
                     "all-reduce per step overlapped with the backward",
                  1: "the same"},
        "names": [],
        "fix": None,
        "expected_gain": "none (1.00x): conv-bound (~3.2 TFLOP per rank per step: 128 films x 3 x 8.2 GFLOP; ~40-50 "
                         "ms on an H100, ~2,800 films/s per GPU), ~94 MB fp32 gradient all-reduce (~0.5 ms over "
                         "NVLink) overlapped with the backward, data on the device, balanced ranks",
        "measured_cpu": "one 25 s pair under load: as-is 885 steps, --fixed (the same job) 812: 1.09x the other "
                        "way, the machine's noise",
        "note": "Data-parallel CNN training done right: data on the device, channels_last, bf16, balanced ranks. "
                "No warning is right.",
        "script": "multi_rank_fresh13.py",
    },
}

import argparse
import collections
import json
import math
import os
import queue
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
from filelock import FileLock  # a dependency of torch itself

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


# --------------------------------------------------------------------------- crop_yield


class StatusBoard:
    """Rank 0's live status for the team dashboard: the training loop posts a small record every step and a
    thread appends them to a JSON-lines file, so that the loop never waits on the disk."""

    def __init__(self, path: str, blocking: bool) -> None:
        self.path = path
        self.blocking = blocking
        self.pending: queue.Queue | collections.deque = queue.Queue() if blocking else collections.deque()
        threading.Thread(target=self._drain, daemon=True, name="status-board").start()

    def post(self, **record) -> None:
        if self.blocking:
            self.pending.put(record)
        else:
            self.pending.append(record)

    def _drain(self) -> None:
        with open(self.path, "a") as f:
            if self.blocking:  # sleeps in get() until a record comes
                while True:
                    f.write(json.dumps(self.pending.get()) + "\n")
                    f.flush()
            while True:  # polls the deque, so that a record is on disk the moment it is posted
                while self.pending:
                    f.write(json.dumps(self.pending.popleft()) + "\n")
                    f.flush()


class YieldRegressor(nn.Module):
    """A temporal Transformer over a season of satellite composites (spectral bands and weather per date),
    mean-pooled, then a small head for the yield (t/ha)."""

    def __init__(self, features: int, dates: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.register_buffer("pos", sincos(dates, width, torch.device("cpu"))[None], persistent=False)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h).mean(1)).squeeze(-1)


def job_crop_yield(t: Trainer) -> None:
    if t.small:
        cfg = {"fields": 4096, "dates": 36, "features": 16, "width": 64, "layers": 2, "heads": 4, "batch": 32}
    else:
        cfg = {"fields": 131_072, "dates": 36, "features": 16, "width": 384, "layers": 8, "heads": 6, "batch": 512}
    g = torch.Generator(device=t.dev).manual_seed(140 + t.rank)  # the rank's share of the surveyed fields
    series = torch.randn(cfg["fields"], cfg["dates"], cfg["features"], generator=g, device=t.dev)
    truth = torch.randn(cfg["features"], device=t.dev, generator=g)
    yields = 6 + (series.mean(1) @ truth) + 0.3 * torch.randn(cfg["fields"], device=t.dev, generator=g)
    model = t.wrap(YieldRegressor(cfg["features"], cfg["dates"], cfg["width"], cfg["layers"], cfg["heads"]))
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 5e-4, weight_decay=0.05)
    sched = warmup_cosine(opt, 300, 50_000)
    board = None
    if t.rank == 0:  # rank 0 feeds the dashboard
        board = StatusBoard(os.path.join(tempfile.mkdtemp(prefix="crop_yield_"), "status.jsonl"), blocking=t.fixed)
        log(f"crop-yield Transformer {count_params(model):.1f}M parameters, {cfg['batch']} fields per rank, "
            f"status board {'blocking queue' if t.fixed else 'polling a deque'} at {board.path}")
    model.train()
    step = 0
    while True:
        order = torch.randperm(cfg["fields"], device=t.dev, generator=g)
        for s in range(0, cfg["fields"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[s:s + cfg["batch"]]
            with t.autocast():
                pred = model(series[idx])
            loss = F.huber_loss(pred.float(), yields[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if board is not None:
                board.post(step=step, t=round(time.time(), 3), lr=sched.get_last_lr()[0])
                if step % 100 == 0:
                    board.post(step=step, loss=loss.item())


# --------------------------------------------------------------------------- grid_load


class LoadForecaster(nn.Module):
    """A Transformer encoder over a week of hourly readings (load, weather, calendar), predicting the next day."""

    def __init__(self, features: int, hours: int, horizon: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.register_buffer("pos", sincos(hours, width, torch.device("cpu"))[None], persistent=False)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(hours * width, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h).flatten(1))


def append_metrics(t: Trainer, path: str, step: int, local_loss: torch.Tensor) -> None:
    """One line per rank per logging step in the run's metrics.csv, with the rank's loss and the mean over ranks.
    The ranks share the file: the FileLock keeps their lines from interleaving."""
    lock = FileLock(path + ".lock")
    if t.fixed:  # reduce first, then hold the lock only for the write
        mean = local_loss.detach().clone()
        dist.all_reduce(mean)
        line = f"{step},{t.rank},{local_loss.item():.5f},{mean.item() / t.world:.5f}\n"
        with lock:
            with open(path, "a") as f:
                f.write(line)
        return
    with lock:
        mean = local_loss.detach().clone()
        dist.all_reduce(mean)
        with open(path, "a") as f:
            f.write(f"{step},{t.rank},{local_loss.item():.5f},{mean.item() / t.world:.5f}\n")


def job_grid_load(t: Trainer) -> None:
    if t.small:
        cfg = {"series": 2048, "hours": 48, "horizon": 12, "features": 12, "width": 64, "layers": 2, "heads": 4,
               "batch": 16, "log_every": 50}
    else:
        cfg = {"series": 32_768, "hours": 168, "horizon": 24, "features": 12, "width": 512, "layers": 6,
               "heads": 8, "batch": 256, "log_every": 200}
    g = torch.Generator(device=t.dev).manual_seed(150 + t.rank)  # the rank's substations
    x = torch.randn(cfg["series"], cfg["hours"], cfg["features"], generator=g, device=t.dev)
    w = torch.randn(cfg["features"], cfg["horizon"], device=t.dev, generator=g) / cfg["features"] ** 0.5
    y = x[:, -1] @ w + 0.1 * torch.randn(cfg["series"], cfg["horizon"], device=t.dev, generator=g)
    model = t.wrap(LoadForecaster(cfg["features"], cfg["hours"], cfg["horizon"], cfg["width"], cfg["layers"],
                                  cfg["heads"]))
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 3e-4, weight_decay=0.01)
    sched = warmup_cosine(opt, 300, 40_000)
    # the run directory both ranks write to (shared storage on the cluster; the launcher's run id names it)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT", "local")
    run_dir = os.path.join(tempfile.gettempdir(), f"grid_load-{run_id}")
    os.makedirs(run_dir, exist_ok=True)
    metrics = os.path.join(run_dir, "metrics.csv")
    if t.rank == 0:
        log(f"grid-load forecaster {count_params(model):.1f}M parameters, {cfg['batch']} x {cfg['hours']} h per rank, "
            f"metrics every {cfg['log_every']} steps to {metrics}")
    model.train()
    step = 0
    while True:
        for s in torch.randperm(cfg["series"] // cfg["batch"]).tolist():
            xb = x[s * cfg["batch"]:(s + 1) * cfg["batch"]]
            yb = y[s * cfg["batch"]:(s + 1) * cfg["batch"]]
            with t.autocast():
                pred = model(xb)
            loss = F.mse_loss(pred.float(), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % cfg["log_every"] == 0:
                append_metrics(t, metrics, step, loss)


# --------------------------------------------------------------------------- recipe_lm


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity in the forward, all-reduce of the input gradient over the tensor-parallel group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce of the partial outputs in the forward, identity in the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class ColumnParallelLinear(nn.Module):
    """The output features split over the tensor-parallel ranks; the input is replicated."""

    def __init__(self, d_in: int, d_out: int, tp: int) -> None:
        super().__init__()
        self.tp = tp
        self.lin = nn.Linear(d_in, d_out // tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(_CopyToTP.apply(x) if self.tp > 1 else x)


class RowParallelLinear(nn.Module):
    """The input features split over the tensor-parallel ranks; the partial outputs are summed."""

    def __init__(self, d_in: int, d_out: int, tp: int) -> None:
        super().__init__()
        self.tp = tp
        self.lin = nn.Linear(d_in // tp, d_out, bias=False)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.tp > 1:
            y = _ReduceFromTP.apply(y)
        return y + self.bias


class TPBlock(nn.Module):
    """A pre-LN decoder block with Megatron-style tensor parallelism (heads and MLP columns split over tp ranks)."""

    def __init__(self, width: int, heads: int, tp: int) -> None:
        super().__init__()
        self.local_heads = heads // tp
        self.head_dim = width // heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = ColumnParallelLinear(width, 3 * width, tp)
        self.proj = RowParallelLinear(width, width, tp)
        self.fc = ColumnParallelLinear(width, 4 * width, tp)
        self.fc_proj = RowParallelLinear(4 * width, width, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, self.local_heads * self.head_dim))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class RecipeLM(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int, tp: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList(TPBlock(width, heads, tp) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def job_recipe_lm(t: Trainer) -> None:
    if t.small:
        cfg = {"vocab": 2048, "ctx": 64, "width": 64, "layers": 2, "heads": 4, "batch": 8, "tokens": 400_000}
    else:
        cfg = {"vocab": 32_000, "ctx": 1024, "width": 1024, "layers": 24, "heads": 16, "batch": 16,
               "tokens": 50_000_000}
    # the parallel layout comes from the team's 7B recipe: tensor parallel over the node's GPUs, every rank on the
    # same batch; --fixed: plain data parallel, each rank on its half of the batch, the full model on every GPU
    tp = 1 if t.fixed else t.world
    per_rank = cfg["batch"] // t.world if t.fixed else cfg["batch"]
    # replicated weights (embeddings, norms, head) must start equal on every rank; the shards differ
    torch.manual_seed(160)
    model = RecipeLM(cfg["vocab"], cfg["ctx"], cfg["width"], cfg["layers"], cfg["heads"], tp)
    shard_gen = torch.Generator().manual_seed(170 + (t.rank if tp > 1 else 0))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02, generator=shard_gen if ".lin." in name else None)
    model = model.to(t.dev)
    if t.fixed:
        model = DDP(model, device_ids=[t.local] if t.cuda else None)
    opt = adamw(t, model.parameters(), lr=3e-4 if not t.small else 1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    sched = warmup_cosine(opt, 500, 100_000)
    # tokenized recipes: the same corpus on every rank; the tensor-parallel ranks must also draw the same windows
    gc = torch.Generator(device=t.dev).manual_seed(180)
    corpus = torch.randint(0, cfg["vocab"], (cfg["tokens"],), generator=gc, device=t.dev, dtype=torch.int32)
    g = torch.Generator(device=t.dev).manual_seed(190 + (t.rank if t.fixed else 0))
    if t.rank == 0:
        log(f"recipe LM {count_params(model):.0f}M parameters on each rank "
            f"({'tensor parallel over ' + str(tp) + ' ranks' if tp > 1 else 'data parallel, full model per rank'}), "
            f"{per_rank} x {cfg['ctx']} tokens per rank, {cfg['batch']} sequences per step")
    offsets = torch.arange(cfg["ctx"] + 1, device=t.dev)
    model.train()
    step = 0
    while True:
        start = torch.randint(0, cfg["tokens"] - cfg["ctx"] - 1, (per_rank, 1), generator=g, device=t.dev)
        w = corpus[start + offsets].long()
        with t.autocast():
            loss = model(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        t.trained(cfg["batch"])
        if step % 50 == 0 and t.rank == 0:
            log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- chest_xray


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, mid: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, c_out, 1, bias=False), nn.BatchNorm2d(c_out)
        nn.init.zeros_(self.bn3.weight)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, depths: list[int], width: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, c_in = [], width
        for i, d in enumerate(depths):
            mid = width * 2 ** i
            for j in range(d):
                layers.append(Bottleneck(c_in, mid, mid * 4, 2 if (j == 0 and i > 0) else 1))
                c_in = mid * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


def job_chest_xray(t: Trainer) -> None:
    if t.small:
        cfg = {"n": 512, "size": 32, "depths": [1, 1, 1, 1], "width": 16, "batch": 16, "findings": 14}
    else:
        cfg = {"n": 8192, "size": 224, "depths": [3, 4, 6, 3], "width": 64, "batch": 128, "findings": 14}
    g = torch.Generator(device=t.dev).manual_seed(200 + t.rank)  # the rank's share of the radiographs (uint8)
    films = torch.randint(0, 256, (cfg["n"], 1, cfg["size"], cfg["size"]), generator=g, device=t.dev,
                          dtype=torch.uint8)
    findings = (torch.rand(cfg["n"], cfg["findings"], generator=g, device=t.dev) < 0.1).float()
    model = t.wrap(ResNet(cfg["depths"], cfg["width"], cfg["findings"]).to(memory_format=torch.channels_last))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * cfg["batch"] * t.world / 256, momentum=0.9, nesterov=True,
                          weight_decay=1e-4)
    sched = warmup_cosine(opt, 500, 60_000)
    if t.rank == 0:
        log(f"chest x-ray ResNet {count_params(model):.1f}M parameters, {cfg['batch']} films per rank, channels_last, "
            f"data on the device")
    model.train()
    step = 0
    while True:
        order = torch.randperm(cfg["n"], device=t.dev, generator=g)
        for s in range(0, cfg["n"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[s:s + cfg["batch"]]
            x = films[idx]
            flip = torch.rand(len(idx), 1, 1, 1, device=t.dev, generator=g) < 0.5
            x = ((torch.where(flip, x.flip(3), x).float() - 128.0) / 64.0).expand(-1, 3, -1, -1)
            x = x.contiguous(memory_format=torch.channels_last)
            with t.autocast():
                logits = model(x)
            loss = F.binary_cross_entropy_with_logits(logits.float(), findings[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


JOBS = {"crop_yield": job_crop_yield, "grid_load": job_grid_load, "recipe_lm": job_recipe_lm,
        "chest_xray": job_chest_xray}


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
