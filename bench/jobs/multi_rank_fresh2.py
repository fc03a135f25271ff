"""Two-rank training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh2.py \\
        --job MODE --device cuda|cpu [--fixed]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``), gloo on the CPU (small sizes, one thread per rank,
each rank on a core of its own where there are two). ``--fixed`` is the same job once its user has
fixed the problem; the bench compares the two by the samples/s rank 0 prints.

The jobs, as their users would tell it:

``ckpt_rank0``
    A residual-MLP regressor trained with DistributedDataParallel, bf16 autocast, AdamW. Rank 0
    writes a full checkpoint (``save_checkpoint``: model + optimizer state, ``torch.save`` to a
    local directory, about 1.6 GB on CUDA) every ``CKPT_EVERY`` steps, synchronously, inside the
    training loop. Meanwhile rank 1 has gone on to the next step and waits in its gradient
    all-reduce (DDP, inside ``loss.backward()``; on CUDA its CPU then waits in ``loss.item()``)
    until rank 0 is done writing. ``--fixed``: checkpoints every ``CKPT_EVERY_FIXED`` steps
    (an interval no measurement window reaches).

``cpu_metric_rank1``
    A multi-label tagger (residual MLP, 32 labels) trained with DDP. The rank that reports to
    the experiment tracker (``--metrics-rank``, default 1: the last rank, on the node the
    tracker's agent runs on) computes a per-label ROC-AUC on every step: it pulls the logits to
    the host (``.cpu().numpy()``) and runs a hand-written rank-sum AUC in pure Python
    (``roc_auc_per_class``: a sort and a loop per label) before its next step. Rank 0 waits in
    the gradient all-reduce. ``--fixed``: the AUC is computed with tensor ops on the device
    (``roc_auc_torch``), and only every ``LOG_EVERY`` steps.

``hf_healthy_ddp``
    A GPT-2 (124M, ``transformers.GPT2LMHeadModel`` built from a ``GPT2Config``, no pretrained
    weights) trained with DDP, bf16 autocast, fused AdamW, batch 16 x 1024 tokens per rank,
    synthetic token batches generated on the GPU up front. Both ranks do the same work; the loss
    is read (``.item()``) once every 50 steps. Nothing is wrong: no warning is right.
    ``--fixed``: the same job.

``barrier_hang``
    DDP; every ``eval_every`` steps (the first a few seconds after warm-up) each rank predicts
    on its validation shard and publishes the predictions to the team's artifact store
    (``publish_predictions``): upload, then ``dist.barrier()`` so that rank 0 can merge every
    shard. Rank 1's store endpoint refuses the connection: the ``ConnectionRefusedError`` is
    caught by the ``try/except`` around upload *and* barrier, so rank 1 skips the barrier, hands
    the upload to a background retry thread (``retry_upload``, which never succeeds) and blocks
    in ``wait_for_upload`` (``threading.Event.wait()``, no timeout) "so that the next shard is not
    written before this one is stored". Rank 0 waits in ``dist.barrier()`` forever.
    ``--fixed``: the barrier is in a ``finally`` (every rank enters it) and a failed upload is
    retried in the background a bounded number of times, never waited on.

``grad_accum_sync``
    A ~300M-parameter residual MLP trained with DDP and gradient accumulation: 8 micro-batches
    of 32 samples per optimizer step, bf16 autocast. The accumulation micro-steps are not wrapped
    in ``model.no_sync()``, so DDP all-reduces the full gradient (1.2 GB fp32) after every
    micro-batch instead of once per optimizer step: both ranks spend most of each step in the
    all-reduce. Both ranks do the same; neither is a straggler. ``--fixed``: the first 7
    micro-steps run under ``model.no_sync()``.

Every rank prints ``rank R ready`` once past its warm-up (a few steps, then a
``torch.cuda.synchronize()`` on CUDA); the hanging job hangs about ``HANG_AFTER_S`` seconds
after that. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks). Every process ends when its launcher dies or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "ckpt_rank0": {
        "verdict": "straggler", "rank": 0, "phase": "checkpoint",
        "where": {0: "save_checkpoint: torch.save of model + optimizer state (device-to-host copies, pickling, "
                     "file writes) every CKPT_EVERY steps",
                  1: "waits in the gradient all-reduce of the next step (DDP, in loss.backward(); on CUDA its CPU "
                     "then waits in loss.item())"},
        "names": ["save_checkpoint"],
        "fix": "checkpoint less often, or asynchronously (torch.distributed.checkpoint.async_save, or snapshot "
               "the state to host memory and write it from a background thread)",
        "note": "DDP, identical per-rank work; rank 0 alone runs a synchronous ~1.6 GB torch.save (on CUDA; "
                "~75 MB on CPU) every few steps inside the loop, so each save stalls the next all-reduce and "
                "rank 1 waits for it. The slow rank is rank 0.",
    },
    "cpu_metric_rank1": {
        "verdict": "straggler", "rank": 1, "phase": "cpu",
        "where": {0: "waits in the gradient all-reduce (DDP, in loss.backward(); on CUDA its CPU then waits in "
                     "loss.item())",
                  1: "roc_auc_per_class (from log_metrics): pure-Python sort + rank-sum loop per label on the "
                     "host, after logits.cpu().numpy(), in the main thread every step"},
        "names": ["roc_auc_per_class"],
        "fix": "compute the metric on the device with tensor ops (or accumulate and compute it at eval time) "
               "and only every N steps, not in pure Python on every step",
        "note": "Rank 1 (the --metrics-rank) runs roc_auc_per_class on the CPU in its main thread each step; "
                "its GPU idles meanwhile. Rank 0 waits in the next gradient all-reduce.",
    },
    "hf_healthy_ddp": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: GPT-2 forward/backward (bf16 autocast), all-reduce overlapped with backward, fused "
                     "AdamW",
                  1: "the same"},
        "names": [],
        "fix": None,
        "note": "transformers GPT2LMHeadModel from config (124M), DDP, 16 x 1024 tokens per rank, data already "
                "on the GPU, one .item() every 50 steps. Balanced ranks, busy GPUs: no warning is right.",
    },
    "barrier_hang": {
        "verdict": "stuck", "rank": 1, "phase": "io",
        "where": {0: "dist.barrier() in publish_predictions, forever",
                  1: "wait_for_upload -> threading.Event.wait(), forever (its barrier skipped: the "
                     "ConnectionRefusedError from its upload was swallowed by the except around upload + barrier; "
                     "a background retry_upload thread sleeps between failing retries)"},
        "names": ["wait_for_upload"],
        "fix": "rank 1 skipped dist.barrier() in publish_predictions (an upload error swallowed by try/except) "
               "and blocks in wait_for_upload: put the barrier outside the try (or in finally) so every rank "
               "enters it, and never wait without a timeout on a retry that may not succeed",
        "note": "Rank 1 never arrives at the barrier: it waits on a threading.Event in wait_for_upload that "
                "its retry thread (retry_upload, time.sleep between failures) never sets. Rank 0 waits in "
                "dist.barrier() (publish_predictions) forever.",
    },
    "grad_accum_sync": {
        "verdict": "inefficient", "rank": None, "phase": "collective",
        "where": {0: "all-reduces the full gradient after every accumulation micro-step (DDP, in loss.backward())",
                  1: "the same"},
        "names": ["no_sync"],
        "fix": "wrap the accumulation micro-steps in model.no_sync() (all-reduce once per optimizer step)",
        "note": "DDP, 8 micro-batches of 32 per optimizer step on a ~300M-parameter MLP, none under no_sync(): "
                "a 1.2 GB all-reduce per micro-step on both ranks. No straggler: both ranks wait on the "
                "collective equally; the fix is fewer all-reduces.",
    },
}

import argparse
import io
import math
import os
import shutil
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
import torch.nn as nn
import torch.nn.functional as F

MODES = tuple(TRUTHS)
WARM_STEPS = 6          # steps before "rank R ready"
HANG_AFTER_S = 6.0      # the hanging job hangs about this long after "ready"


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


def ddp(run: Run, model: nn.Module, **kw) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = model.to(run.dev)
    return DDP(model, device_ids=[run.local] if run.cuda else None, **kw)


def adamw(run: Run, params, lr: float):
    if run.cuda:
        return torch.optim.AdamW(params, lr=lr, fused=True)
    return torch.optim.AdamW(params, lr=lr)


class ResidualMLP(nn.Module):
    def __init__(self, d_in: int, width: int, hidden: int, blocks: int, n_out: int = 1) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
            for _ in range(blocks))
        self.head = nn.Linear(width, n_out)
        self.n_out = n_out

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + blk(h)
        out = self.head(h)
        return out.squeeze(-1) if self.n_out == 1 else out


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
    return loss.item()  # the running loss the progress bar shows


# --------------------------------------------------------------------------- ckpt_rank0: a synchronous save


CKPT_EVERY = 20
CKPT_EVERY_FIXED = 5000
KEEP_LAST = 2


def save_checkpoint(model, opt, step: int, ckpt_dir: str) -> str:
    """Model + optimizer state in one file (the usual "resume from here" checkpoint), then prune."""
    state = {
        "step": step,
        "model": model.module.state_dict(),
        "optimizer": opt.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    path = os.path.join(ckpt_dir, f"step-{step:08d}.pt")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # on disk before it replaces the last good one
    os.replace(tmp, path)  # never a half-written "latest"
    kept = sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".pt"))
    for old in kept[:-KEEP_LAST]:
        os.remove(os.path.join(ckpt_dir, old))
    return path


def job_ckpt_rank0(run: Run) -> None:
    if run.tiny:
        sz, batch = dict(d_in=256, width=512, hidden=2048, blocks=3), 16
    else:
        sz, batch = dict(d_in=1024, width=2048, hidden=8192, blocks=4), 8192
    every = CKPT_EVERY_FIXED if run.args.fixed else (3 if run.tiny else CKPT_EVERY)
    model = ddp(run, ResidualMLP(**sz))
    opt = adamw(run, model.parameters(), lr=1e-4)
    n_params = sum(p.numel() for p in model.parameters())
    # One directory per job (a run killed mid-save leaves at most this one behind), emptied at start.
    ckpt_dir = run.args.ckpt_dir or os.path.join(tempfile.gettempdir(), "multi_rank_fresh2-ckpt")
    if run.rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        os.makedirs(ckpt_dir, exist_ok=True)
        log(f"{n_params / 1e6:.1f}M parameters; checkpoint every {every} steps to {ckpt_dir}")
    data = synthetic_regression(run, batch, sz["d_in"])
    step = 0
    try:
        while True:
            x, y = data[step % len(data)]
            loss = train_step(run, model, opt, x, y)
            step += 1
            run.step_done(batch * run.world)
            if step % 100 == 0 and run.rank == 0:
                log(f"step {step}: loss {loss:.4f}")
            if step % every == 0 and run.rank == 0:  # only rank 0 writes: DDP keeps the replicas equal
                save_checkpoint(model, opt, step, ckpt_dir)
    finally:
        if run.rank == 0:
            shutil.rmtree(ckpt_dir, ignore_errors=True)


# --------------------------------------------------------------------------- cpu_metric_rank1: AUC in Python


N_LABELS = 32
LOG_EVERY = 50


def multilabel_data(run: Run, batch: int, d_in: int, n_batches: int = 4):
    g = torch.Generator().manual_seed(run.rank)
    w = torch.randn(d_in, N_LABELS, generator=torch.Generator().manual_seed(1234))
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, d_in, generator=g)
        y = ((x @ w) / math.sqrt(d_in) + 0.5 * torch.randn(batch, N_LABELS, generator=g) > 0.6).float()
        out.append((x.to(run.dev), y.to(run.dev)))
    return out


def roc_auc_per_class(scores, labels) -> list[float]:
    """Per-label ROC-AUC by the rank-sum (Mann-Whitney U) formula, ties averaged."""
    aucs = []
    n, k = scores.shape
    for c in range(k):
        col = scores[:, c].tolist()
        lab = labels[:, c].tolist()
        order = sorted(range(n), key=lambda i: col[i])
        ranks = [0.0] * n
        i = 0
        while i < n:
            j = i
            while j + 1 < n and col[order[j + 1]] == col[order[i]]:
                j += 1
            avg = (i + j) / 2.0 + 1.0
            for t in range(i, j + 1):
                ranks[order[t]] = avg
            i = j + 1
        n_pos = sum(1 for v in lab if v > 0.5)
        n_neg = n - n_pos
        if n_pos == 0 or n_neg == 0:
            aucs.append(float("nan"))
            continue
        rank_sum = sum(r for r, v in zip(ranks, lab) if v > 0.5)
        aucs.append((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
    return aucs


def roc_auc_torch(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same AUC with tensor ops on the device (ties not averaged: fine for float scores)."""
    ranks = scores.argsort(dim=0).argsort(dim=0).float() + 1.0
    pos = labels > 0.5
    n_pos = pos.sum(0).float()
    n_neg = labels.shape[0] - n_pos
    rank_sum = (ranks * pos).sum(0)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg).clamp_min(1)


def log_metrics(logits: torch.Tensor, y: torch.Tensor, step: int, tracker: list) -> None:
    scores = logits.detach().float().sigmoid().cpu().numpy()
    labels = y.cpu().numpy()
    aucs = [a for a in roc_auc_per_class(scores, labels) if a == a]
    tracker.append({"step": step, "macro_auc": sum(aucs) / max(1, len(aucs))})


def job_cpu_metric_rank1(run: Run) -> None:
    if run.tiny:
        sz, batch = dict(d_in=64, width=128, hidden=512, blocks=2), 1024
    else:
        sz, batch = dict(d_in=1024, width=2048, hidden=8192, blocks=4), 8192
    metrics_rank = run.args.metrics_rank % run.world
    model = ddp(run, ResidualMLP(**sz, n_out=N_LABELS))
    opt = adamw(run, model.parameters(), lr=1e-4)
    data = multilabel_data(run, batch, sz["d_in"])
    tracker: list = []
    step = 0
    while True:
        x, y = data[step % len(data)]
        with run.autocast():
            logits = model(x)
            loss = F.binary_cross_entropy_with_logits(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: the gradient all-reduce runs in here
        opt.step()
        loss_val = loss.item()
        step += 1
        if run.rank == metrics_rank:
            if run.args.fixed:
                if step % LOG_EVERY == 0:
                    auc = roc_auc_torch(logits.detach().float(), y).nanmean()
                    tracker.append({"step": step, "macro_auc": auc.item()})
            else:
                log_metrics(logits, y, step, tracker)
            if step % LOG_EVERY == 0 and tracker:
                log(f"step {step}: loss {loss_val:.4f} macro-AUC {tracker[-1]['macro_auc']:.4f}")
        run.step_done(batch * run.world)


# --------------------------------------------------------------------------- hf_healthy_ddp: GPT-2 from config


def gpt2_from_config(run: Run):
    from transformers import GPT2Config, GPT2LMHeadModel

    if run.tiny:
        cfg = GPT2Config(vocab_size=1024, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                         bos_token_id=1023, eos_token_id=1023)
    else:
        cfg = GPT2Config(vocab_size=50304, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    try:
        model = GPT2LMHeadModel(cfg, attn_implementation="sdpa")
    except TypeError:
        cfg._attn_implementation = "sdpa"
        model = GPT2LMHeadModel(cfg)
    return model, cfg


def job_hf_healthy_ddp(run: Run) -> None:
    model, cfg = gpt2_from_config(run)
    batch, seq = (8, 64) if run.tiny else (16, 1024)
    model = ddp(run, model)
    opt = adamw(run, model.parameters(), lr=6e-4)
    n_params = sum(p.numel() for p in model.parameters())
    if run.rank == 0:
        log(f"GPT-2 {n_params / 1e6:.1f}M parameters, {batch} x {seq} tokens per rank")
    g = torch.Generator(device=run.dev).manual_seed(run.rank)
    # Synthetic "pre-tokenized" corpus, already on the device.
    corpus = torch.randint(0, cfg.vocab_size, (8, batch, seq), device=run.dev, generator=g)
    step = 0
    model.train()
    while True:
        ids = corpus[step % len(corpus)]
        with run.autocast():
            out = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()  # DDP: the gradient all-reduce overlaps this
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 and run.rank == 0:
            log(f"step {step}: loss {out.loss.item():.4f}")
        run.step_done(batch * run.world)


# --------------------------------------------------------------------------- barrier_hang: a swallowed error


class ArtifactStore:
    """The team's artifact store, as each node sees it (here: a local directory; rank 1's node has
    a stale endpoint in its environment, so it cannot connect)."""

    def __init__(self, root: str, reachable: bool) -> None:
        self.root = root
        self.reachable = reachable

    def put(self, name: str, payload: bytes) -> None:
        if not self.reachable:
            raise ConnectionRefusedError(111, "Connection refused", "artifacts.internal:9000")
        with open(os.path.join(self.root, name), "wb") as f:
            f.write(payload)

    def get(self, name: str) -> bytes | None:
        p = os.path.join(self.root, name)
        if not os.path.exists(p):
            return None
        with open(p, "rb") as f:
            return f.read()


class Uploader:
    """Retries a failed upload in the background."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self.uploaded = threading.Event()
        self.uploaded.set()

    def start(self, name: str, payload: bytes, max_tries: int | None) -> None:
        self.uploaded.clear()
        threading.Thread(target=self.retry_upload, args=(name, payload, max_tries), daemon=True,
                         name="upload-retry").start()

    def retry_upload(self, name: str, payload: bytes, max_tries: int | None) -> None:
        delay, tries = 0.5, 0
        while max_tries is None or tries < max_tries:
            tries += 1
            try:
                self.store.put(name, payload)
                self.uploaded.set()
                return
            except OSError:
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
        log(f"giving up on {name} after {tries} tries")


def predict(run: Run, model, val) -> torch.Tensor:
    model.eval()
    with torch.no_grad(), run.autocast():
        pred = model(val[0]).float()
    model.train()
    return pred


def merge_predictions(store: ArtifactStore, step: int, world: int) -> None:
    parts = []
    for r in range(world):
        blob = store.get(f"preds-step{step}-rank{r}.pt")
        if blob is not None:
            parts.append(torch.load(io.BytesIO(blob)))
    n = sum(len(p) for p in parts)
    log(f"step {step}: merged {len(parts)} of {world} prediction shards ({n} rows)")


def publish_predictions(run: Run, store: ArtifactStore, uploader: Uploader, pred: torch.Tensor, step: int) -> bool:
    """Upload this rank's predictions, wait for every rank's, rank 0 merges. False: the upload failed."""
    name = f"preds-step{step}-rank{run.rank}.pt"
    buf = io.BytesIO()
    torch.save(pred.cpu(), buf)
    payload = buf.getvalue()
    if run.args.fixed:
        try:
            store.put(name, payload)
            ok = True
        except OSError as e:
            log(f"rank {run.rank}: upload of {name} failed ({e!r}); retrying in the background")
            uploader.start(name, payload, max_tries=5)
            ok = False
        finally:
            dist.barrier()  # every rank, whatever its upload did
        if run.rank == 0:
            merge_predictions(store, step, run.world)
        return ok
    try:
        store.put(name, payload)
        dist.barrier()  # every shard is in the store
        if run.rank == 0:
            merge_predictions(store, step, run.world)
    except OSError as e:
        log(f"rank {run.rank}: upload of {name} failed ({e!r}); retrying in the background")
        uploader.start(name, payload, max_tries=None)
        return False
    return True


def wait_for_upload(uploader: Uploader) -> None:
    """Don't write the next shard before this one is stored."""
    uploader.uploaded.wait()


def job_barrier_hang(run: Run) -> None:
    if run.tiny:
        sz, batch = dict(d_in=64, width=128, hidden=512, blocks=2), 64
    else:
        sz, batch = dict(d_in=1024, width=2048, hidden=8192, blocks=4), 8192
    model = ddp(run, ResidualMLP(**sz))
    opt = adamw(run, model.parameters(), lr=1e-4)
    data = synthetic_regression(run, batch, sz["d_in"])
    val = synthetic_regression(run, batch, sz["d_in"], n_batches=1, seed=99)[0]
    root = os.path.join(tempfile.gettempdir(), f"multi_rank_fresh2-artifacts-rank{run.rank}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    store = ArtifactStore(root, reachable=run.rank != 1)
    uploader = Uploader(store)
    eval_every = 10**9
    step = 0
    try:
        while True:
            x, y = data[step % len(data)]
            train_step(run, model, opt, x, y)
            step += 1
            run.step_done(batch * run.world)
            if step == 2 * WARM_STEPS:
                eval_every = step + run.steps_until(HANG_AFTER_S)
            if step % eval_every == 0:
                pred = predict(run, model, val)
                if not publish_predictions(run, store, uploader, pred, step) and not run.args.fixed:
                    wait_for_upload(uploader)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- grad_accum_sync


ACCUM = 8


def job_grad_accum_sync(run: Run) -> None:
    if run.tiny:
        sz, micro = dict(d_in=256, width=512, hidden=2048, blocks=3), 4
    else:
        sz, micro = dict(d_in=1024, width=4096, hidden=18432, blocks=2), 32
    model = ddp(run, ResidualMLP(**sz))
    opt = adamw(run, model.parameters(), lr=1e-4)
    n_params = sum(p.numel() for p in model.parameters())
    if run.rank == 0:
        log(f"{n_params / 1e6:.0f}M parameters, {ACCUM} micro-batches of {micro} per step")
    data = synthetic_regression(run, micro, sz["d_in"], n_batches=ACCUM)
    step = 0
    while True:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i, (x, y) in enumerate(data):
            last = i == ACCUM - 1
            if run.args.fixed and not last:
                with model.no_sync():
                    with run.autocast():
                        loss = F.mse_loss(model(x).float(), y) / ACCUM
                    loss.backward()
            else:
                with run.autocast():
                    loss = F.mse_loss(model(x).float(), y) / ACCUM
                loss.backward()  # DDP all-reduces the gradient here, every micro-step
            total += loss.detach()
        opt.step()
        step += 1
        if step % 20 == 0 and run.rank == 0:
            log(f"step {step}: loss {float(total):.4f}")
        run.step_done(micro * ACCUM * run.world)


JOBS = {"ckpt_rank0": job_ckpt_rank0, "cpu_metric_rank1": job_cpu_metric_rank1,
        "hf_healthy_ddp": job_hf_healthy_ddp, "barrier_hang": job_barrier_hang,
        "grad_accum_sync": job_grad_accum_sync}


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
    ap.add_argument("--ckpt-dir", default=None, help="where rank 0 writes checkpoints (default: a temp dir)")
    ap.add_argument("--metrics-rank", type=int, default=-1,
                    help="the rank that logs metrics to the tracker (default: the last rank)")
    args = ap.parse_args(argv)
    watchdog(args.seconds)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    # A hang stays a hang for the whole run: no collective timeout before --seconds is up.
    timeout = timedelta(seconds=args.seconds + 120)
    if args.device == "cuda":
        torch.cuda.set_device(local)
        torch.backends.cuda.matmul.allow_tf32 = True
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
