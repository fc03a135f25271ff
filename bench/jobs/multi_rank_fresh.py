"""Two-rank training jobs, each with one known problem, started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh.py \\
        --job MODE --device cuda|cpu [--fixed]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``), gloo on the CPU (small sizes, one thread per rank,
each rank on a core of its own where there are two). ``--fixed`` is the same job once its user has
fixed the problem; the bench compares the two by the samples/s rank 0 prints.

The jobs, as their users would tell it:

``uneven``
    A residual-MLP regressor trained with DistributedDataParallel, bf16 autocast. The data was
    split into shards by a weights list (``SHARD_WEIGHTS = [1, 2]``) left over from a
    heterogeneous cluster, so each step rank 0 trains on N samples and rank 1 on 2N. Every
    step rank 1 computes twice as long; rank 0 sits in the gradient all-reduce waiting for it.
    ``--fixed``: both ranks get 1.5N, the same global batch.

``colocated``
    The same DDP model with the same per-rank batch on both ranks. Rank 1 also starts the
    team's "online evaluator" (``eval_worker``: a separate process, the same script with
    ``--role eval-worker``) on its own GPU, which runs large matmuls non-stop. GPU 1 is
    time-shared between two processes, so rank 1's steps take longer; rank 0 waits in the
    all-reduce. ``--fixed``: no evaluator. No clock, power or other card setting is touched.
    (On the CPU the evaluator shares rank 1's core.)

``fsdp_slow``
    A small GPT trained with FSDP2 (``fully_shard`` per block, bf16 params). Each rank reads
    its shard's pre-tokenized cache; rank 1's cache was never built, so rank 1 tokenizes every
    document itself, in its main process, with a hand-written pure-Python tokenizer
    (``tokenize_slowly``) each step. Rank 0 waits in FSDP's all-gathers / reduce-scatters.
    ``--fixed``: both shards are cached (tokenized once, up front).

``queue_hang``
    DDP with a prefetch thread per rank that pulls batches from a remote shard stream into a
    ``queue.Queue``; the training loop takes each batch with ``next_batch`` (``queue.get()``,
    no timeout). A few seconds after warm-up rank 1's stream connection drops
    (``ConnectionResetError``): its prefetch thread dies (a traceback on stderr) and rank 1
    blocks forever in ``next_batch``. Rank 0 trains on into the next step's gradient
    all-reduce and waits there forever. ``--fixed``: the stream does not drop.

``order_mismatch``
    DDP; every ``eval_every`` steps (the first a few seconds after warm-up) the ranks evaluate
    and then sync. A refactor left the sync inconsistent: rank 0 (``report_metrics``) calls
    ``dist.all_reduce`` on the eval statistics to log them, while the other ranks
    (``receive_lr_schedule``) call ``dist.broadcast`` waiting for rank 0's new learning-rate
    table. Both ranks block, each in a different collective. ``--fixed``: every rank
    all-reduces the statistics, then every rank takes part in the broadcast.

``loader_starved``
    DDP fed by a ``DataLoader`` with 2 workers per rank. Rank 0's shard is pre-decoded
    (float32 records); rank 1's shard was shipped as JSON lines, so rank 1's workers parse
    every record (``decode_record``) and cannot keep up: rank 1's main process waits on its
    DataLoader, rank 0 waits in the all-reduce. ``--fixed``: rank 1's shard is pre-decoded too.

Every rank prints ``rank R ready`` once past its warm-up (a few steps, then a
``torch.cuda.synchronize()`` on CUDA); the hanging jobs hang about ``HANG_AFTER_S`` seconds
after that. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks). Every process ends when its launcher dies or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "uneven": {
        "verdict": "straggler", "rank": 1, "phase": "compute",
        "where": {0: "waits in the gradient all-reduce (DDP, in loss.backward())", 1: "computes: forward/backward on twice the batch"},
        "names": [],
        "fix": "even the per-rank batch / shard sizes (rank 1 trains on twice rank 0's samples per step)",
        "note": "DDP, rank 0 batch N, rank 1 batch 2N; rank 0 waits in the gradient all-reduce inside "
                "loss.backward() for about half of each step. Both GPUs are otherwise identical.",
    },
    "colocated": {
        "verdict": "straggler", "rank": 1, "phase": "compute",
        "where": {0: "waits in the gradient all-reduce (DDP, in loss.backward())", 1: "computes, on a GPU shared with its eval worker"},
        "names": [],
        "fix": "move the other process off GPU 1 (the eval worker, '--role eval-worker', shares rank 1's GPU)",
        "note": "Both ranks do identical work; a second process (a child of rank 1, its command line has "
                "'--role eval-worker') runs bf16 matmuls non-stop on rank 1's GPU, so GPU 1 is time-shared "
                "and rank 1 is slower. Rank 0 waits in the all-reduce.",
    },
    "fsdp_slow": {
        "verdict": "straggler", "rank": 1, "phase": "data",
        "where": {0: "waits in FSDP all-gather / reduce-scatter", 1: "tokenize_slowly (load_batch), pure Python in the main thread"},
        "names": ["tokenize_slowly"],
        "fix": "move tokenization out of the training loop: pre-tokenize rank 1's shard (or tokenize in "
               "DataLoader workers / a fast tokenizer)",
        "note": "FSDP2 (fully_shard); rank 1 runs pure-Python tokenize_slowly (called from load_batch) in its "
                "main process each step; rank 0 waits in FSDP's all-gather / reduce-scatter.",
    },
    "queue_hang": {
        "verdict": "stuck", "rank": 1, "phase": "data",
        "where": {0: "gradient all-reduce of the next step, forever", 1: "next_batch -> queue.Queue.get(), forever"},
        "names": ["next_batch"],
        "fix": "rank 1's prefetch thread died (ConnectionResetError from its shard stream): handle/re-raise "
               "producer errors and use queue.get(timeout=...)",
        "note": "Rank 1 never arrives: it blocks in next_batch -> queue.Queue.get() with no producer left. "
                "Rank 0 waits in the gradient all-reduce (DDP, in loss.backward(); on CUDA its CPU then "
                "waits in loss.item()).",
    },
    "order_mismatch": {
        "verdict": "desync", "rank": 1, "phase": "collective",
        "where": {0: "dist.all_reduce in report_metrics, forever", 1: "dist.broadcast in receive_lr_schedule, forever"},
        "names": ["all_reduce", "broadcast"],
        "fix": "make every rank issue the same collectives in the same order (rank 0's all_reduce in "
               "report_metrics vs rank 1's broadcast in receive_lr_schedule)",
        "note": "At the first evaluation rank 0 is in dist.all_reduce (report_metrics) while rank 1 is in "
                "dist.broadcast(src=0) (receive_lr_schedule): different collectives, both wait forever. "
                "On CUDA the CPU of each then waits in .tolist()/.item() right after the call.",
    },
    "loader_starved": {
        "verdict": "straggler", "rank": 1, "phase": "data",
        "where": {0: "waits in the gradient all-reduce (DDP, in loss.backward())", 1: "waits on its DataLoader (workers in decode_record)"},
        "names": ["decode_record"],
        "fix": "pre-decode rank 1's shard (or give rank 1's DataLoader more workers)",
        "note": "Rank 1's DataLoader workers (2, separate processes) parse JSON records in decode_record; "
                "rank 1's main process waits on its DataLoader for the next batch, rank 0 waits in the "
                "gradient all-reduce.",
    },
}

import argparse
import json
import math
import os
import queue
import random
import subprocess
import sys
import threading
import time
import unicodedata
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
import torch.nn as nn
import torch.nn.functional as F

MODES = tuple(TRUTHS)
WARM_STEPS = 6          # steps before "rank R ready"
HANG_AFTER_S = 6.0      # the hanging jobs hang about this long after "ready"


# --------------------------------------------------------------------------- what every job shares


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
        self.t_ready = 0.0
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
            self.t_ready = time.perf_counter()
            print(f"rank {self.rank} ready", flush=True)

    def steps_until(self, seconds_after_ready: float) -> int:
        """Steps from now to about ``seconds_after_ready`` after "ready", at the pace since "ready":
        the same number on every rank (a collective: every rank calls it at the same step)."""
        self.sync()
        pace = (time.perf_counter() - self.t_ready) / max(1, self.steps - WARM_STEPS)
        left = seconds_after_ready - (time.perf_counter() - self.t_ready)
        t = torch.tensor([pace, left], dtype=torch.float64, device=self.dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        pace, left = t.tolist()
        return max(1, math.ceil(left / max(pace, 1e-4)))

    def _report(self) -> None:
        while True:
            time.sleep(RATE_EVERY_S)
            with self._lock:
                line = f"gputop-workload rate t={time.time():.3f} steps={self.steps} samples={self.samples}"
            print(line, flush=True)


def ddp(run: Run, model: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = model.to(run.dev)
    return DDP(model, device_ids=[run.local] if run.cuda else None)


class ResidualMLP(nn.Module):
    def __init__(self, d_in: int, width: int, hidden: int, blocks: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
            for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + blk(h)
        return self.head(h).squeeze(-1)


def mlp_sizes(run: Run) -> dict:
    # CUDA: ~135 M parameters, a few GB of activations at the largest batch here.
    if run.tiny:
        return dict(d_in=64, width=128, hidden=512, blocks=2)
    return dict(d_in=1024, width=2048, hidden=8192, blocks=4)


def synthetic_regression(run: Run, batch: int, d_in: int, n_batches: int = 4, seed: int = 0):
    """A few fixed batches of (features, target), already on the device, cycled through."""
    g = torch.Generator().manual_seed(seed + run.rank)
    w = torch.randn(d_in, generator=torch.Generator().manual_seed(1234))
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, d_in, generator=g)
        out.append((x.to(run.dev), (x @ w).tanh().to(run.dev)))
    return out


def train_step(run: Run, model, opt, x, y) -> float:
    with run.autocast():
        loss = F.mse_loss(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()  # DDP: the gradient all-reduce runs in here
    opt.step()
    return loss.item()  # the running loss a progress bar shows


# --------------------------------------------------------------------------- uneven: uneven shards


SHARD_WEIGHTS = [1, 2]  # left over from a cluster where node 1 had twice the GPUs


def per_rank_batches(global_batch: int, weights: list[int]) -> list[int]:
    total = sum(weights)
    return [global_batch * w // total for w in weights]


def job_uneven(run: Run) -> None:
    sz = mlp_sizes(run)
    global_batch = 3072 if run.tiny else 24576
    weights = [1] * run.world if run.args.fixed else SHARD_WEIGHTS[:run.world]
    batches = per_rank_batches(global_batch, weights)
    my_batch = batches[run.rank]
    log(f"rank {run.rank}: per-rank batch {my_batch} (global {sum(batches)})")
    model = ddp(run, ResidualMLP(**sz))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = synthetic_regression(run, my_batch, sz["d_in"])
    step = 0
    while True:
        x, y = data[step % len(data)]
        train_step(run, model, opt, x, y)
        step += 1
        run.step_done(sum(batches))


# --------------------------------------------------------------------------- colocated: a shared GPU


def eval_worker(args: argparse.Namespace) -> None:
    """The "online evaluator" rank 1 starts on its own GPU: large matmuls, non-stop."""
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(args.gpu)
        dev, n, dtype = torch.device("cuda", args.gpu), 8192, torch.bfloat16
    else:
        torch.set_num_threads(1)
        dev, n, dtype = torch.device("cpu"), 384, torch.float32
    parent = os.getppid()
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    torch.matmul(a, b, out=c)
    if cuda:
        torch.cuda.synchronize()
    print("eval worker up", flush=True)
    deadline = time.monotonic() + args.seconds
    while os.getppid() == parent and time.monotonic() < deadline:
        for _ in range(20):
            torch.matmul(a, b, out=c)
        if cuda:
            torch.cuda.synchronize()


def start_eval_worker(run: Run) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "eval-worker", "--device", run.args.device,
           "--gpu", str(run.local), "--seconds", str(run.args.seconds)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()  # wait until it is up
    log(f"rank {run.rank}: eval worker pid {proc.pid} on {run.dev}")
    return proc


def job_colocated(run: Run) -> None:
    sz = mlp_sizes(run)
    batch = 384 if run.tiny else 8192
    if run.rank == 1 and not run.args.fixed:
        start_eval_worker(run)
    model = ddp(run, ResidualMLP(**sz))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = synthetic_regression(run, batch, sz["d_in"])
    step = 0
    while True:
        x, y = data[step % len(data)]
        train_step(run, model, opt, x, y)
        step += 1
        run.step_done(batch * run.world)


# --------------------------------------------------------------------------- fsdp_slow: Python tokenizer


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


SYLLABLES = ["ka", "ri", "to", "ne", "su", "mo", "la", "vi", "de", "po", "an", "el", "or", "us", "im",
             "str", "ing", "ion", "ent", "ous", "pre", "con", "ab", "ex", "qu", "th", "sh", "ch"]


def build_vocab(size: int) -> dict[str, int]:
    rnd = random.Random(7)
    vocab = {"<unk>": 0, " ": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz.,;:!?'-0123456789":
        vocab.setdefault(ch, len(vocab))
    while len(vocab) < size:
        vocab.setdefault("".join(rnd.choice(SYLLABLES) for _ in range(rnd.randint(1, 3))), len(vocab))
    return vocab


def make_documents(n: int, words: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    docs = []
    for _ in range(n):
        out = []
        for i in range(words):
            w = "".join(rnd.choice(SYLLABLES) for _ in range(rnd.randint(1, 4)))
            if rnd.random() < 0.15:
                w = w.capitalize()
            out.append(w + (". " if i % 12 == 11 else " "))
        docs.append("".join(out))
    return docs


def tokenize_slowly(text: str, vocab: dict[str, int], max_piece: int = 6) -> list[int]:
    """A hand-written tokenizer: per-character normalization, then greedy longest match per word."""
    chars = []
    for ch in text:
        ch = unicodedata.normalize("NFKC", ch)
        if unicodedata.category(ch).startswith("C"):
            continue
        chars.append(ch.lower())
    norm = "".join(chars)
    ids = []
    for word in norm.split(" "):
        i = 0
        while i < len(word):
            for j in range(min(len(word), i + max_piece), i, -1):
                tid = vocab.get(word[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                ids.append(0)
                i += 1
        ids.append(1)
    return ids


def window(ids: list[int], seq: int, rnd: random.Random) -> list[int]:
    if len(ids) < seq + 1:
        ids = ids * (seq // max(1, len(ids)) + 2)
    s = rnd.randrange(0, len(ids) - seq)
    return ids[s:s + seq + 1]


def load_batch(docs, cache, vocab, batch: int, seq: int, rnd: random.Random) -> torch.Tensor:
    rows = []
    for _ in range(batch):
        d = rnd.randrange(len(docs))
        ids = cache[d] if cache is not None else tokenize_slowly(docs[d], vocab)
        rows.append(window(ids, seq, rnd))
    return torch.tensor(rows, dtype=torch.long)


def fully_shard_fn():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # PyTorch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def job_fsdp_slow(run: Run) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, MixedPrecisionPolicy = fully_shard_fn()
    if run.tiny:
        cfg = dict(vocab=512, d=64, heads=4, layers=2, seq=32)
        batch, words = 4, 2400
    else:
        cfg = dict(vocab=8192, d=1024, heads=16, layers=8, seq=1024)
        batch, words = 8, 2400
    vocab = build_vocab(cfg["vocab"])
    docs = make_documents(48, words, seed=run.rank)
    # Each shard ships with a pre-tokenized cache, except rank 1's, which was never built.
    have_cache = run.args.fixed or run.rank != 1
    cache = [tokenize_slowly(d, vocab) for d in docs] if have_cache else None
    log(f"rank {run.rank}: token cache {'loaded' if have_cache else 'missing, tokenizing on the fly'}")

    mesh = init_device_mesh(run.dev.type, (run.world,))
    model = GPT(**cfg).to(run.dev)
    kw = dict(mesh=mesh)
    if run.cuda:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rnd = random.Random(run.rank)
    while True:
        tokens = load_batch(docs, cache, vocab, batch, cfg["seq"], rnd).to(run.dev, non_blocking=True)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        run.step_done(batch * run.world)


# --------------------------------------------------------------------------- queue_hang: a dead producer


class RemoteShardStream:
    """Batches of a shard on a remote store (here: a few batches in RAM, cycled through)."""

    def __init__(self, batches) -> None:
        self.batches = batches
        self.i = 0
        self.drops_at: float | None = None  # time.monotonic() the connection drops (rank 1's, this run)

    def __iter__(self):
        return self

    def __next__(self):
        if self.drops_at is not None and time.monotonic() >= self.drops_at:
            raise ConnectionResetError("shard stream: connection reset by peer")
        b = self.batches[self.i % len(self.batches)]
        self.i += 1
        return b


def prefetch(stream: RemoteShardStream, q: queue.Queue) -> None:
    for batch in stream:
        q.put(batch)


def next_batch(q: queue.Queue):
    return q.get()


def job_queue_hang(run: Run) -> None:
    sz = mlp_sizes(run)
    batch = 64 if run.tiny else 8192
    model = ddp(run, ResidualMLP(**sz))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    host = [(x.cpu(), y.cpu()) for x, y in synthetic_regression(run, batch, sz["d_in"])]
    if run.cuda:
        host = [(x.pin_memory(), y.pin_memory()) for x, y in host]
    stream = RemoteShardStream(host)
    q: queue.Queue = queue.Queue(maxsize=8)
    threading.Thread(target=prefetch, args=(stream, q), daemon=True, name="shard-prefetch").start()
    step = 0
    while True:
        x, y = next_batch(q)
        x, y = x.to(run.dev, non_blocking=True), y.to(run.dev, non_blocking=True)
        train_step(run, model, opt, x, y)
        step += 1
        run.step_done(batch * run.world)
        if step == WARM_STEPS and run.rank == 1 and not run.args.fixed:
            stream.drops_at = time.monotonic() + HANG_AFTER_S - 0.5  # then the few prefetched batches


# --------------------------------------------------------------------------- order_mismatch


def evaluate(run: Run, model, val) -> torch.Tensor:
    model.eval()
    with torch.no_grad(), run.autocast():
        x, y = val
        err = model(x).float() - y
    model.train()
    return torch.stack([err.square().sum(), err.abs().sum(), torch.tensor(float(len(y)), device=run.dev),
                        err.abs().max()])


def report_metrics(stats: torch.Tensor, step: int) -> None:
    dist.all_reduce(stats)
    sse, sae, n, _ = stats.tolist()
    if dist.get_rank() == 0:
        log(f"step {step}: val mse {sse / n:.4f} mae {sae / n:.4f}")


def receive_lr_schedule(lr_table: torch.Tensor, step: int) -> float:
    dist.broadcast(lr_table, src=0)
    return float(lr_table[step % len(lr_table)].item())


def job_order_mismatch(run: Run) -> None:
    sz = mlp_sizes(run)
    batch = 64 if run.tiny else 8192
    model = ddp(run, ResidualMLP(**sz))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = synthetic_regression(run, batch, sz["d_in"])
    val = synthetic_regression(run, batch, sz["d_in"], n_batches=1, seed=99)[0]
    lr_table = torch.full((4096,), 1e-4, device=run.dev)
    eval_every = 10**9
    step = 0
    while True:
        x, y = data[step % len(data)]
        train_step(run, model, opt, x, y)
        step += 1
        run.step_done(batch * run.world)
        if step == 2 * WARM_STEPS:
            eval_every = step + run.steps_until(HANG_AFTER_S)
        if step % eval_every == 0:
            stats = evaluate(run, model, val)
            if run.args.fixed:
                report_metrics(stats, step)
                lr = receive_lr_schedule(lr_table, step)
            elif run.rank == 0:
                report_metrics(stats, step)  # the broadcast of the new lr table was to follow: never reached
                lr = float(lr_table[step % len(lr_table)].item())
            else:
                lr = receive_lr_schedule(lr_table, step)
            for g in opt.param_groups:
                g["lr"] = lr


# --------------------------------------------------------------------------- loader_starved


class Shard(torch.utils.data.Dataset):
    """Rank r's records: pre-decoded float32 rows, or JSON lines to parse per record."""

    def __init__(self, n: int, d_in: int, seed: int, as_json: bool) -> None:
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(d_in, generator=torch.Generator().manual_seed(1234))
        x = torch.randn(n, d_in, generator=g)
        y = (x @ w).tanh()
        self.as_json = as_json
        if as_json:
            self.records = [json.dumps({"id": i, "features": [round(v, 6) for v in x[i].tolist()],
                                        "target": float(y[i])}) for i in range(n)]
        else:
            self.x, self.y = x, y

    def __len__(self) -> int:
        return 1_000_000_000

    def __getitem__(self, i: int):
        if self.as_json:
            return decode_record(self.records[i % len(self.records)])
        j = i % len(self.x)
        return self.x[j], self.y[j]


def decode_record(line: str):
    rec = json.loads(line)
    feats = [float(v) if v == v else 0.0 for v in rec["features"]]  # NaN -> 0
    return torch.tensor(feats, dtype=torch.float32), torch.tensor(rec["target"], dtype=torch.float32)


def job_loader_starved(run: Run) -> None:
    if run.tiny:
        sz, batch, n = dict(d_in=1024, width=128, hidden=512, blocks=2), 128, 512
    else:
        sz, batch, n = dict(d_in=1024, width=2048, hidden=8192, blocks=4), 512, 2048
    as_json = run.rank == 1 and not run.args.fixed
    shard = Shard(n, sz["d_in"], seed=run.rank, as_json=as_json)
    loader = torch.utils.data.DataLoader(shard, batch_size=batch, num_workers=2, pin_memory=run.cuda,
                                         persistent_workers=True, prefetch_factor=4)
    model = ddp(run, ResidualMLP(**sz))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for x, y in loader:
        x, y = x.to(run.dev, non_blocking=True), y.to(run.dev, non_blocking=True)
        train_step(run, model, opt, x, y)
        run.step_done(batch * run.world)


JOBS = {"uneven": job_uneven, "colocated": job_colocated, "fsdp_slow": job_fsdp_slow,
        "queue_hang": job_queue_hang, "order_mismatch": job_order_mismatch, "loader_starved": job_loader_starved}


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
    ap.add_argument("--job", choices=MODES)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--fixed", action="store_true", help="the same job with its problem fixed")
    ap.add_argument("--tiny", action="store_true", help="small sizes (always on with --device cpu)")
    ap.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    ap.add_argument("--role", default="rank", choices=("rank", "eval-worker"), help=argparse.SUPPRESS)
    ap.add_argument("--gpu", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "eval-worker":
        eval_worker(args)
        return 0
    if not args.job:
        ap.error("--job is required")
    watchdog(args.seconds)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        backend = "nccl"
    else:
        torch.set_num_threads(1)
        pin_to_own_core(int(os.environ.get("RANK", local)))
        backend = "gloo"
    # A hang stays a hang for the whole run: no collective timeout before --seconds is up.
    dist.init_process_group(backend, timeout=timedelta(seconds=args.seconds + 120))
    torch.manual_seed(0)
    run = Run(args)
    JOBS[args.job](run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
