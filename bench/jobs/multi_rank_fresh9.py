"""Two-rank DDP training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh9.py \\
        --job MODE --device cuda|cpu [--fixed] [--seconds N]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``, bf16 autocast), gloo on the CPU (small sizes, fp32,
one thread per rank, each rank on a core of its own where there are two). ``--fixed`` is the same
job once its user has fixed the problem (for the hang: the job without the hang); the bench compares
the two by the samples/s rank 0 prints. Plain PyTorch DDP only: every model is built in code with
random weights, every data set is generated in memory. The CUDA sizes were reasoned out, not run: no
GPU was at hand.

The jobs, as their users would tell it (then what is really going on, and what ``--fixed`` should
gain; the CPU figures were measured on the shared 2-core machine these jobs were written on, see
``TRUTHS[mode]["measured_cpu"]``):

``roof_segmentation``
    Roof segmentation of aerial tiles for a solar-potential map: a small U-Net (CPU: width 16, 64 px
    crops of 128 px tiles, 4 per rank; CUDA: width 64, 256 px crops of 512 px tiles, 16 per rank),
    DDP, AdamW, BCE on the mask. The tiles (uint8) and masks are in memory, sharded by a
    ``DistributedSampler(shuffle=False)``, loaded in the main process. ``RoofTiles.positive_crop``
    samples random crops until one contains roof pixels ("empty crops teach the model nothing").
    "A minute in, the job stops; one process at 100 % CPU, the other idle, no error."
    Truth: stuck, rank 1 (the culprit; rank 0 is the one waiting), phase ``data``. One tile of the
    list has no roof at all (fields and forest); it falls to rank 1 in its step 25 (CPU) / 40
    (CUDA, ~1-2 s after the ready line at ~30-50 ms a step). ``positive_crop``'s ``while True``
    loop never finds a roof pixel: rank 1 spins in ``__getitem__`` for ever and never reaches its
    next forward. Rank 0 waits for ever in the next step's first collective: DDP's pre-forward
    buffer broadcast of the BatchNorm statistics (``_sync_buffers``; on gloo the host blocks there;
    on NCCL its GPU sits in that broadcast/the gradient all-reduce and its host blocks at the next
    host sync, ``loss.item()`` every 20 steps). ``--fixed``: ``positive_crop`` gives up after 20
    tries and returns a random crop (MONAI-style fallback); the job runs on.

``news_topics``
    Topic classification of news articles (20 topics): a Transformer encoder (CPU: width 128, 2
    layers, 60k articles; CUDA: width 512, 6 layers, 200k articles of 32-64 tokens, 256 per rank,
    4 loader workers) over the tokenized corpus, kept as the tokenizer returned it: a list of dicts
    of Python lists (``NewsArticles.examples``), padded per batch by ``pad_collate``. DDP, AdamW,
    clipping. "Rank 0 sits in the all-reduce most of the time; two GPUs are slower than one was."
    Truth: straggler, rank 1, phase ``host`` (Python on the CPU between steps). A debug hook left
    in from chasing an out-of-memory on rank 1 (``OOM_DEBUG_RANK = 1``): rank 1 calls
    ``free_memory()`` after every optimizer step, i.e. ``gc.collect()`` and
    ``torch.cuda.empty_cache()``. A full collection walks the whole corpus (hundreds of thousands
    of dicts and lists, ~10M references): ~100-150 ms per step; the emptied cache makes the next
    step ``cudaMalloc`` its activations again (``cudaFree`` syncs the device). Rank 0 waits for rank
    1 in every gradient all-reduce. ``--fixed``: the hook is gone (``OOM_DEBUG_RANK`` unused).
    Expected gain on CUDA: a ~10-15 ms step (~1.9 TFLOP per rank, 16k tokens) against ~100-150 ms
    of ``gc.collect()`` + a few ms of re-allocation on rank 1: ~5-10x (>= 1.5x as long as a
    collection costs more than ~6 ms). CPU: 5.2x measured.

``ad_ctr``
    Click-through-rate prediction for ads: DCN-v2 (26 categorical features, one ``nn.Embedding``
    each, CPU: 5k rows x 16, CUDA: 20k rows x 32; 13 dense features; 3 cross layers; a 3-layer MLP;
    CPU: 512, CUDA: 4,096 impressions per rank), DDP, fused AdamW, data on the device. For the
    dashboard, every step's metrics are averaged over the ranks by ``gather_metrics``: a dict of
    ``loss.item()``, ``pred.mean().item()``, accuracy ``.item()`` and the learning rate, passed
    through ``dist.all_gather_object``. "GPU utilization is 40-50 % on both GPUs."
    Truth: inefficient, no straggler (both ranks alike), phase ``sync``. The step is small and
    launch-bound (~300 kernels, ~0.1 TFLOP); three ``.item()`` calls plus ``all_gather_object``
    (pickle, a size all-gather, ``.item()`` on the sizes, the data all-gather, ``.cpu()`` of each
    result) block the host until the GPU has drained, every step: the GPU idles while the host
    launches the next step, and the host idles while the GPU runs. ``--fixed``: the metrics are
    accumulated in a device tensor and reduced with one ``dist.all_reduce`` every 100 steps.
    Expected gain on CUDA: host time ~4-5 ms (300 launches plus DDP hooks) and GPU time ~3-4 ms
    (small kernels plus a 66 MB gradient all-reduce, ~0.5 ms) overlap when fixed (~5 ms a step)
    but add up as-is, plus ~1 ms for the gather itself: ~8-9 ms, ~1.5-1.8x. CPU: no sync to lose
    there, only the pickling and two small gloo collectives (measured in ``TRUTHS``).

``source_lm``
    Pre-training a small code-completion GPT (CPU: width 128, 2 layers, 2,048 vocabulary, 8 x 64
    tokens per rank; CUDA: GPT-2-small shape, width 768, 12 layers, 49,152 vocabulary, 124M
    parameters, 12 x 1024 tokens per rank), DDP, fused AdamW, clipping, packed token shards in
    memory. Truth: healthy. Compute-bound (~9 TFLOP per rank per step, ~25-35 ms on an H100), one
    ~500 MB fp32 gradient all-reduce per step (~3 ms over NVLink) overlapped with the backward,
    balanced ranks. ``--fixed``: the same job. Expected gain: none (1.00x).

Every rank prints ``gputop-workload ready pid=P`` once past its warm-up (a few optimizer steps,
then a ``torch.cuda.synchronize()`` on CUDA): one line per rank, so two such lines mean both ranks
are training. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks; N: optimizer steps). Every process ends when its launcher dies or
after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "roof_segmentation": {
        "verdict": "stuck", "rank": 1, "phase": "data",
        "where": {0: "waits for ever in the next step's first collective: DDP's pre-forward broadcast of the BatchNorm "
                     "buffers (_sync_buffers; gloo: host blocked there; NCCL: GPU in that broadcast / the gradient "
                     "all-reduce, host blocked at the next host sync, loss.item() in the every-20-steps log)",
                  1: "spins for ever in RoofTiles.positive_crop (a while True loop in __getitem__, called by the "
                     "DataLoader in the main process) on a tile whose mask has no roof pixel: never reaches its "
                     "next forward/collective"},
        "names": ["positive_crop", "RoofTiles", "__getitem__", "while True", "max_tries"],
        "fix": "bound the rejection sampling (give up after N tries and return a random crop, what --fixed does) or "
               "drop tiles without foreground from the list up front",
        "expected_gain": "no hang (CUDA: the hang starts at rank 1's step 40, ~1-2 s after the ready line)",
        "measured_cpu": "hangs at step 25 on every as-is run: last progress 4.0 s after the first rate line, then none for the rest of the 25 s run (rank 1 at 100 % CPU in positive_crop); --fixed: 284 steps in 24 s, ~98 samples/s, no hang",
        "note": "A rejection sampler with no bound meets a sample it can never accept on one rank: that rank spins in "
                "its data loading, the other hangs in the next collective. No error, no timeout within the run.",
    },
    "news_topics": {
        "verdict": "straggler", "rank": 1, "phase": "host",
        "where": {0: "waits in every DDP gradient all-reduce (and the pre-forward sync) for rank 1",
                  1: "free_memory() after every optimizer step (OOM_DEBUG_RANK = 1, a leftover debug hook): "
                     "gc.collect() walks the whole in-memory corpus of Python dicts/lists (NewsArticles.examples), "
                     "then torch.cuda.empty_cache() (CUDA only) drops the cached blocks the next step reallocates"},
        "names": ["free_memory", "gc.collect", "empty_cache", "OOM_DEBUG_RANK", "NewsArticles"],
        "fix": "remove the per-step free_memory() hook (debug code for one rank); if memory really needs managing, "
               "gc.freeze() after loading the corpus / store it as tensors, and never empty_cache() per step",
        "expected_gain": "about 5-10x on CUDA: rank 1 adds ~100-150 ms of full garbage collection (~400k containers, "
                         "~10M references; 110 ms measured here for 300k containers / 7M references) plus a few ms "
                         "of cudaMalloc/cudaFree after empty_cache() to a ~10-15 ms step (~1.9 TFLOP per rank); "
                         ">= 1.5x as long as a collection costs > ~6 ms",
        "measured_cpu": "5.2x: as-is 70.9 samples/s (54 steps in 24 s), --fixed 367.4 and 367.7 samples/s (two 25 s runs), rank 0's rate over the window from 3 s after the first rate line",
        "note": "One rank runs gc.collect() (+ empty_cache on CUDA) every step over a large Python-object data set; "
                "the other rank waits for it in every all-reduce.",
    },
    "ad_ctr": {
        "verdict": "inefficient", "rank": None, "phase": "sync",
        "where": {0: "gather_metrics() after every optimizer step: loss.item(), pred.mean().item(), accuracy .item(), "
                     "then dist.all_gather_object of the dict (pickle, size all-gather, .item(), data all-gather, "
                     ".cpu()): the host waits for the GPU to drain every step",
                  1: "the same"},
        "names": ["gather_metrics", "all_gather_object", "item"],
        "fix": "accumulate the metrics in a device tensor and dist.all_reduce it every N steps (what --fixed does), "
               "or log from rank 0 only, without per-step host syncs",
        "expected_gain": "about 1.5-1.8x on CUDA: a launch-bound step (~300 kernels, ~0.1 TFLOP, 66 MB gradient "
                         "all-reduce ~0.5 ms); host ~4-5 ms and GPU ~3-4 ms overlap when fixed (~5 ms a step) but "
                         "serialize as-is, plus ~1 ms for the object gather: ~8-9 ms. CPU: ~1.0-1.1x (nothing to "
                         "overlap; only pickling and two small gloo collectives)",
        "measured_cpu": "1.11x on one 25 s pair (as-is 13150 samples/s, 295 steps in 24 s; --fixed 14542 samples/s; an earlier interrupted --fixed run 14080) on a shared 2-core machine: within this machine's noise, as expected",
        "note": "Per-step metric logging through .item() and all_gather_object: host-device syncs every step on a "
                "small, launch-bound model. Both ranks alike; no straggler. The CPU cannot show it.",
    },
    "source_lm": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: GPT forward/backward on its packed shard, one gradient all-reduce per step overlapped "
                     "with the backward",
                  1: "the same"},
        "names": [],
        "fix": None,
        "expected_gain": "none (1.00x): compute-bound (124M parameters, ~9 TFLOP per rank per step, ~25-35 ms on an "
                         "H100), ~500 MB fp32 all-reduce (~3 ms over NVLink) overlapped, balanced ranks",
        "measured_cpu": "as-is 183.4 samples/s, --fixed (the same job) 208.4 samples/s, one 25 s pair each: 1.14x, noise of this shared 2-core machine",
        "note": "Plain DDP language-model pre-training done right: data in memory, balanced ranks. No warning is right.",
    },
}

import argparse
import gc
import json
import math
import os
import random
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


# --------------------------------------------------------------------------- roof_segmentation


class TinyUNet(nn.Module):
    """A two-level U-Net for binary masks (roof / not roof)."""

    def __init__(self, width: int) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                                 nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

        self.down1 = block(3, width)
        self.down2 = block(width, 2 * width)
        self.mid = block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = block(2 * width, width)
        self.out = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        m = self.mid(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(m), d2], 1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], 1))
        return self.out(u1)


class RoofTiles(Dataset):
    """Aerial tiles (uint8, in memory) with their roof masks; __getitem__ returns a random crop that shows roof."""

    def __init__(self, n: int, size: int, crop: int, empty: set[int], max_tries: int | None, seed: int = 3) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
        masks = torch.zeros(n, size, size, dtype=torch.bool)
        for i in range(n):  # a few rectangular roofs per tile
            for _ in range(6):
                y, x = torch.randint(0, size - size // 8, (2,), generator=g).tolist()
                masks[i, y:y + size // 8, x:x + size // 8] = True
        for i in empty:  # tiles over fields and forest: no roof in the whole tile
            masks[i] = False
        self.masks = masks
        self.crop = crop
        self.max_tries = max_tries

    def __len__(self) -> int:
        return len(self.images)

    def positive_crop(self, i: int) -> tuple[int, int]:
        """Sample crops until one contains roof pixels (empty crops teach the model nothing, said the paper)."""
        size, c = self.masks.shape[-1], self.crop
        tries = 0
        while True:
            y, x = torch.randint(0, size - c + 1, (2,)).tolist()
            if self.masks[i, y:y + c, x:x + c].any():
                return y, x
            tries += 1
            if self.max_tries is not None and tries >= self.max_tries:
                return y, x  # fall back to a random crop

    def __getitem__(self, i: int):
        y, x = self.positive_crop(i)
        c = self.crop
        return self.images[i, :, y:y + c, x:x + c], self.masks[i, y:y + c, x:x + c]


def job_roof_segmentation(t: Trainer) -> None:
    if t.small:
        cfg = {"size": 128, "crop": 64, "width": 16, "batch": 4, "n": 512, "bad_step": 25}
    else:
        cfg = {"size": 512, "crop": 256, "width": 64, "batch": 16, "n": 2048, "bad_step": 40}
    # the tile list is one file for all ranks; DistributedSampler(shuffle=False) gives rank 1 the odd indices.
    # The first roofless tile falls in rank 1's step bad_step.
    empty = {2 * (cfg["bad_step"] * cfg["batch"] + 2) + 1}
    data = RoofTiles(cfg["n"], cfg["size"], cfg["crop"], empty, max_tries=20 if t.fixed else None)
    sampler = DistributedSampler(data, shuffle=False, drop_last=True)
    loader = DataLoader(data, batch_size=cfg["batch"], sampler=sampler, drop_last=True, num_workers=0,
                        pin_memory=t.cuda)
    model = t.wrap(TinyUNet(cfg["width"]))
    opt = adamw(t, model.parameters(), lr=1e-3, weight_decay=1e-4)
    sched = warmup_cosine(opt, 100, 20_000)
    if t.rank == 0:
        log(f"roof U-Net {count_params(model):.2f}M parameters, {cfg['batch']} crops of {cfg['crop']} px per rank")
    model.train()
    step = 0
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for img, mask in loader:
            x = img.to(t.dev, non_blocking=True).float() / 127.5 - 1.0
            y = mask.to(t.dev, non_blocking=True).float().unsqueeze(1)
            with t.autocast():
                logits = model(x)
            loss = F.binary_cross_entropy_with_logits(logits.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 20 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- news_topics

OOM_DEBUG_RANK = 1  # rank 1 hit "CUDA out of memory" on 3 March; left in while chasing it


def free_memory() -> None:
    """Release what the step left behind: Python garbage first, then the allocator's cached blocks."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class TopicClassifier(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, ctx: int, classes: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width, padding_idx=0)
        self.positions = nn.Embedding(ctx, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == 0
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        x = self.norm(self.encoder(x, src_key_padding_mask=pad))
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        return self.head((x * keep).sum(1) / keep.sum(1).clamp(min=1))


class NewsArticles(Dataset):
    """Tokenized headlines + ledes, kept as the tokenizer returned them: a dict of Python lists per article."""

    def __init__(self, n: int, ctx: int, vocab: int, classes: int, seed: int) -> None:
        rng = random.Random(seed)
        ids = list(range(vocab))
        self.examples = [{"input_ids": [ids[rng.randrange(5, vocab)] for _ in range(rng.randrange(ctx // 2, ctx + 1))],
                          "label": rng.randrange(classes)} for _ in range(n)]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return self.examples[i]


def pad_collate(batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, b in enumerate(batch):
        ids[row, :len(b["input_ids"])] = torch.tensor(b["input_ids"])
    return ids, torch.tensor([b["label"] for b in batch])


def job_news_topics(t: Trainer) -> None:
    if t.small:
        cfg = {"vocab": 8000, "ctx": 48, "width": 128, "layers": 2, "heads": 4, "batch": 16, "n": 60_000,
               "workers": 0}
    else:
        cfg = {"vocab": 32000, "ctx": 64, "width": 512, "layers": 6, "heads": 8, "batch": 256, "n": 200_000,
               "workers": 4}
    classes = 20
    t0 = time.time()
    data = NewsArticles(cfg["n"], cfg["ctx"], cfg["vocab"], classes, seed=11)  # the whole corpus, on every rank
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=cfg["batch"], sampler=sampler, drop_last=True, collate_fn=pad_collate,
                        num_workers=cfg["workers"], pin_memory=t.cuda, persistent_workers=cfg["workers"] > 0)
    model = t.wrap(TopicClassifier(cfg["vocab"], cfg["width"], cfg["layers"], cfg["heads"], cfg["ctx"], classes))
    opt = adamw(t, model.parameters(), lr=5e-4, weight_decay=0.01)
    sched = warmup_cosine(opt, 100, 20_000)
    debug_oom = (not t.fixed) and t.rank == OOM_DEBUG_RANK
    if t.rank == 0:
        log(f"news topic classifier {count_params(model):.1f}M parameters, {len(data)} articles "
            f"(loaded in {time.time() - t0:.1f} s), batch {cfg['batch']} per rank")
    model.train()
    step = 0
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for ids, label in loader:
            ids = ids.to(t.dev, non_blocking=True)
            label = label.to(t.dev, non_blocking=True)
            with t.autocast():
                logits = model(ids)
            loss = F.cross_entropy(logits.float(), label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if debug_oom:
                free_memory()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 50 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- ad_ctr


class CrossNetCTR(nn.Module):
    """DCN-v2: one embedding table per categorical feature, a cross network and a deep MLP."""

    def __init__(self, n_sparse: int, n_dense: int, rows: int, dim: int, crosses: int, hidden: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(n_sparse))
        width = n_sparse * dim + n_dense
        self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(crosses))
        self.deep = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden // 2), nn.ReLU())
        self.head = nn.Linear(width + hidden // 2, 1)

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([tab(sparse[:, i]) for i, tab in enumerate(self.tables)] + [dense], 1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return self.head(torch.cat([x, self.deep(x0)], 1)).squeeze(1)


def gather_metrics(metrics: dict) -> dict:
    """Average this step's metrics over the ranks (for the dashboard)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, metrics)
    return {k: sum(m[k] for m in everyone) / len(everyone) for k in metrics}


def job_ad_ctr(t: Trainer) -> None:
    if t.small:
        cfg = {"sparse": 26, "dense": 13, "rows": 5000, "dim": 16, "crosses": 3, "hidden": 256, "batch": 512}
    else:
        cfg = {"sparse": 26, "dense": 13, "rows": 20000, "dim": 32, "crosses": 3, "hidden": 512, "batch": 4096}
    model = t.wrap(CrossNetCTR(cfg["sparse"], cfg["dense"], cfg["rows"], cfg["dim"], cfg["crosses"], cfg["hidden"]))
    opt = adamw(t, model.parameters(), lr=1e-3)
    sched = warmup_cosine(opt, 100, 50_000)
    g = torch.Generator().manual_seed(90 + t.rank)  # the rank's day of impressions
    n = cfg["batch"] * 16
    sparse = torch.randint(0, cfg["rows"], (n, cfg["sparse"]), generator=g).to(t.dev)
    dense = torch.randn(n, cfg["dense"], generator=g).to(t.dev)
    clicks = (torch.rand(n, generator=g) < 0.03).float().to(t.dev)
    if t.rank == 0:
        log(f"DCN-v2 CTR model {count_params(model):.1f}M parameters, batch {cfg['batch']} per rank, metrics "
            f"{'accumulated on the device' if t.fixed else 'gathered with all_gather_object every step'}")
    model.train()
    step = 0
    sums = torch.zeros(3, device=t.dev)
    while True:
        order = torch.randperm(n, device=t.dev)
        for s in range(0, n - cfg["batch"] + 1, cfg["batch"]):
            idx = order[s:s + cfg["batch"]]
            y = clicks[idx]
            with t.autocast():
                logit = model(sparse[idx], dense[idx])
            loss = F.binary_cross_entropy_with_logits(logit.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            with torch.no_grad():
                pred = logit.float().sigmoid()
                if t.fixed:  # accumulate on the device, reduce once per 100 steps
                    sums += torch.stack([loss.detach(), pred.mean(), ((pred > 0.5) == (y > 0.5)).float().mean()])
                else:
                    metrics = gather_metrics({"loss": loss.item(), "ctr_pred": pred.mean().item(),
                                              "acc": ((pred > 0.5) == (y > 0.5)).float().mean().item(),
                                              "lr": sched.get_last_lr()[0]})
            if t.fixed and step % 100 == 0:
                dist.all_reduce(sums)
                metrics = dict(zip(("loss", "ctr_pred", "acc"), (sums / (100 * t.world)).tolist()))
                sums.zero_()
            t.trained(cfg["batch"] * t.world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: loss {metrics['loss']:.4f} predicted ctr {metrics['ctr_pred']:.4f}")


# --------------------------------------------------------------------------- source_lm


class CodeGPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(ctx, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(T, device=ids.device))
        x = self.blocks(x, mask=self.causal[:T, :T], is_causal=True)
        return self.head(self.norm(x))


def job_source_lm(t: Trainer) -> None:
    if t.small:
        cfg = {"vocab": 2048, "ctx": 64, "width": 128, "layers": 2, "heads": 4, "batch": 8}
    else:
        cfg = {"vocab": 49152, "ctx": 1024, "width": 768, "layers": 12, "heads": 12, "batch": 12}
    model = t.wrap(CodeGPT(cfg["vocab"], cfg["ctx"], cfg["width"], cfg["layers"], cfg["heads"]))
    opt = adamw(t, model.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95))
    sched = warmup_cosine(opt, 200, 100_000)
    g = torch.Generator().manual_seed(60 + t.rank)  # the rank's packed shard of the code corpus
    tokens = torch.randint(0, cfg["vocab"], (cfg["batch"] * 64, cfg["ctx"] + 1), generator=g)
    if t.rank == 0:
        log(f"code LM {count_params(model):.1f}M parameters, {cfg['batch']} x {cfg['ctx']} tokens per rank")
    model.train()
    step = 0
    while True:
        for s in torch.randperm(len(tokens) // cfg["batch"], generator=g).tolist():
            chunk = tokens[s * cfg["batch"]:(s + 1) * cfg["batch"]].to(t.dev, non_blocking=True)
            with t.autocast():
                logits = model(chunk[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), chunk[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 50 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


JOBS = {"roof_segmentation": job_roof_segmentation, "news_topics": job_news_topics, "ad_ctr": job_ad_ctr,
        "source_lm": job_source_lm}


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
