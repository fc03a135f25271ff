"""Two-rank training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh4.py \\
        --job MODE --device cuda|cpu [--fixed]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``), gloo on the CPU (small sizes, one thread per rank,
each rank on a core of its own where there are two). ``--fixed`` is the same job once its user has
fixed the problem; the bench compares the two by the samples/s rank 0 prints.

The jobs, as their users would tell it:

``accelerate_mlm``
    RoBERTa-base masked-LM pre-training (``transformers.RobertaForMaskedLM`` from a
    ``RobertaConfig``, ~125M parameters, no pretrained weights) with Hugging Face Accelerate:
    ``Accelerator(mixed_precision="bf16")``, ``accelerator.prepare`` on the model, AdamW, a warm-up
    schedule and a ``DataLoader`` (4 workers, pinned memory, non-blocking copies) over a
    pre-tokenized corpus in memory; the workers apply the 80/10/10 masking (``MLMCollator``).
    32 x 512 tokens per rank, gradient clipping, the loss gathered and logged every 100 steps.
    Both ranks do the same work. Nothing is wrong: no warning is right. ``--fixed``: the same job.

``sft_length_sampler``
    Supervised fine-tuning of a Pythia-410M-style causal LM (``transformers.GPTNeoXForCausalLM``
    from a ``GPTNeoXConfig``, ~405M parameters) with DDP and bf16 autocast, on conversations of
    very different lengths (32 to 2048 tokens), 12 per rank per step, padded to the longest in the
    batch. To cut padding the team wrote ``LengthGroupedShardSampler``: sort the whole dataset by
    length, give each rank its contiguous share of the sorted list, cut that into batches and
    shuffle their order. So rank 0 only ever gets the short half of the data and rank 1 the long
    half: every step rank 1 computes on ~3-4x the tokens, and rank 0 waits in the gradient
    all-reduce. ``--fixed``: the sorted list is cut into *global* batches (12 x 2 neighbours in
    length order), their order shuffled with the same seed on every rank, and rank r takes every
    second sequence of each (``gb[r::world]``): both ranks get the same lengths each step.

``hardneg_refresh``
    A DPR-style dense retriever: one BERT-base encoder (``transformers.BertModel``, ~110M) for
    queries and passages in a ``BiEncoder`` under DDP, bf16 autocast, InfoNCE over in-batch and
    hard negatives, 64 queries per rank. Every ``REFRESH_EVERY`` steps (the first a few seconds
    after warm-up) rank 0 re-mines the hard negatives with the current model
    (``mine_hard_negatives``) and saves the table to the run's scratch directory; the other ranks
    wait for the file to appear (``wait_for_file``) and load it (``load_hard_negatives``). The
    scratch directory is made with ``tempfile.mkdtemp()`` in every process, so each rank has its
    own: rank 0 writes into its directory and trains on, rank 1 polls for the file in a directory
    nobody writes to, forever (``time.sleep`` in a loop, CPU and GPU idle). Rank 0 waits in the
    next step's DDP collectives (on CUDA its CPU then blocks in ``loss.item()``) forever.
    ``--fixed``: rank 0 makes the scratch directory and broadcasts its path
    (``dist.broadcast_object_list``), so every rank reads where rank 0 writes.

``fsdp_qwen_ckpt``
    A ~300M-parameter Qwen2-style causal LM (``transformers.Qwen2ForCausalLM`` from a
    ``Qwen2Config``: 1024 wide, 20 layers, GQA) pre-trained with FSDP2 (``fully_shard`` per
    decoder layer, bf16 params, fp32 reduce), 8 x 2048 tokens per rank. The training config was
    copied from the team's 7B recipe and still has ``activation_checkpointing: True``, so
    ``model.gradient_checkpointing_enable()`` makes every decoder layer recompute its forward in
    the backward pass, though the model and its activations fit in a fraction of the GPU's memory.
    Both ranks do the same (~1.33x the compute they need); neither is a straggler.
    ``--fixed``: activation checkpointing off.

``convnext_ema``
    A ConvNeXt-Base image classifier (``transformers.ConvNextForImageClassification`` from a
    ``ConvNextConfig``, ~88M parameters) trained with DDP, bf16 autocast, 64 images per rank.
    Rank 0, the rank that evaluates and saves checkpoints, keeps an exponential moving average of
    the weights, on the CPU "to keep GPU memory for the batch" (the ``model_ema_force_cpu`` of
    timm's recipes), and ``update_ema`` runs after every optimizer step: each of the ~340 weight
    tensors is copied to the host (a device sync each) and averaged in, on one CPU thread. Rank 1
    waits in the gradient all-reduce (on CUDA its CPU then waits in ``loss.item()``).
    ``--fixed``: the EMA stays on the GPU and is updated with one ``torch._foreach_lerp_``
    (``update_ema_on_device``), still on rank 0 only.

Every rank prints ``rank R ready`` once past its warm-up (a few steps, then a
``torch.cuda.synchronize()`` on CUDA); the hanging job hangs about ``HANG_AFTER_S`` seconds
after that. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks). Every process ends when its launcher dies or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "accelerate_mlm": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: RoBERTa masked-LM forward/backward (bf16 autocast through Accelerate), DDP all-reduce "
                     "overlapped with backward, AdamW; DataLoader workers mask the next batches ahead",
                  1: "the same"},
        "names": [],
        "fix": None,
        "note": "Accelerate (Accelerator(mixed_precision='bf16'), accelerator.prepare, accelerator.backward) on a "
                "~125M RobertaForMaskedLM from config, 32 x 512 tokens per rank, 4 DataLoader workers with pinned "
                "memory and non-blocking copies keep ahead, the loss read back once every 100 steps. Balanced "
                "ranks, busy GPUs: no warning is right.",
    },
    "sft_length_sampler": {
        "verdict": "straggler", "rank": 1, "phase": "compute",
        "where": {0: "waits in the gradient all-reduce (DDP, in loss.backward(); on CUDA its CPU then waits in "
                     "loss.item()): its batches are the short half of the data",
                  1: "GPT-NeoX forward/backward on much longer padded batches (the long half of the data, ~3-4x "
                     "rank 0's tokens per step), GPU busy"},
        "names": [],
        "fix": "balance the lengths across ranks per step: cut the length-sorted order into global batches and "
               "give each rank an interleaved slice of every global batch (gb[rank::world]) instead of a "
               "contiguous share of the sorted dataset per rank",
        "note": "LengthGroupedShardSampler sorts the whole dataset by length and then shards it contiguously, so "
                "rank 1 always draws the longest conversations. Same batch size (sequences) on both ranks; the "
                "imbalance is in tokens per step. Rank 0 is fast and waits; the slow rank is rank 1.",
    },
    "hardneg_refresh": {
        "verdict": "stuck", "rank": 1, "phase": "io",
        "where": {0: "waits in the next step's DDP collectives (buffer broadcast at the start of the forward, "
                     "gradient all-reduce in loss.backward(); on CUDA its CPU then blocks in loss.item()), forever",
                  1: "wait_for_file (in load_hard_negatives): time.sleep in a polling loop for a file in its own "
                     "mkdtemp() scratch directory that rank 0 never writes to; CPU and GPU idle, forever"},
        "names": ["wait_for_file"],
        "fix": "use one scratch directory for every rank: make it on rank 0 and broadcast its path "
               "(dist.broadcast_object_list), or a fixed shared run directory; better, broadcast the mined "
               "table itself instead of passing it through a file, and give the wait a timeout",
        "note": "DDP dense-retriever job. tempfile.mkdtemp() runs in every process, so rank 0 saves the re-mined "
                "hard negatives into a directory rank 1 never looks in. Rank 1 never reaches the next forward; "
                "rank 0 has gone on and is blocked in the collective waiting for it.",
    },
    "fsdp_qwen_ckpt": {
        "verdict": "inefficient", "rank": None, "phase": "compute",
        "where": {0: "FSDP2 Qwen2 forward/backward with activation checkpointing: every decoder layer's forward "
                     "recomputed inside the backward pass (torch.utils.checkpoint), GPU busy",
                  1: "the same"},
        "names": ["gradient_checkpointing_enable", "checkpoint"],
        "fix": "turn activation checkpointing off (drop model.gradient_checkpointing_enable()): the ~300M model "
               "and its activations at 8 x 2048 tokens fit easily, so the recomputation only costs time",
        "note": "A config copied from a 7B recipe keeps activation_checkpointing on for a ~300M model: ~1/3 more "
                "compute per step on both ranks. Balanced ranks, no straggler; the GPUs are busy, but a third of "
                "the work is recomputation.",
    },
    "convnext_ema": {
        "verdict": "straggler", "rank": 0, "phase": "cpu",
        "where": {0: "update_ema: every weight tensor copied to the host (.to('cpu'), a device sync each) and "
                     "averaged into the CPU-resident EMA, single-threaded, after every optimizer step",
                  1: "waits in the gradient all-reduce (DDP, in loss.backward(); on CUDA its CPU then waits in "
                     "loss.item())"},
        "names": ["update_ema"],
        "fix": "keep the EMA weights on the GPU and update them with one fused on-device op "
               "(torch._foreach_lerp_, update_ema_on_device); if memory is tight, update every N steps",
        "note": "DDP ConvNeXt-Base; only rank 0 (which evaluates and saves) keeps the EMA, and keeps it on the "
                "CPU. Its per-step device-to-host copy of ~88M weights plus the CPU arithmetic make rank 0 the "
                "slow rank; rank 1 waits in the all-reduce.",
    },
}

import argparse
import copy
import math
import os
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
            say(f"rank {self.rank} ready")

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


# --------------------------------------------------------------------------- accelerate_mlm: healthy


class PretokenizedRows(torch.utils.data.Dataset):
    """A pre-tokenized corpus held in memory: fixed-length rows of token ids (<s> ... </s>)."""

    def __init__(self, n_rows: int, seq: int, vocab: int, bos: int, eos: int, first_word: int,
                 virtual_len: int = 1_000_000) -> None:
        g = torch.Generator().manual_seed(1234)  # the same corpus on every rank; the sampler shards it
        self.rows = torch.randint(first_word, vocab, (n_rows, seq), generator=g, dtype=torch.int32)
        self.rows[:, 0] = bos
        self.rows[:, -1] = eos
        self.virtual_len = virtual_len

    def __len__(self) -> int:
        return self.virtual_len  # many passes over the rows: one "epoch" outlasts the run

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i % len(self.rows)]


class MLMCollator:
    """Stack rows and mask them for masked-LM training: 15 % of the word tokens are targets; of those
    80 % become <mask>, 10 % a random word, 10 % stay as they are."""

    def __init__(self, vocab: int, mask_id: int, first_word: int, prob: float = 0.15) -> None:
        self.vocab, self.mask_id, self.first_word, self.prob = vocab, mask_id, first_word, prob

    def __call__(self, rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        ids = torch.stack(rows).long()
        labels = ids.clone()
        special = ids < self.first_word
        target = torch.bernoulli(torch.full(ids.shape, self.prob)).bool() & ~special
        labels[~target] = -100
        to_mask = torch.bernoulli(torch.full(ids.shape, 0.8)).bool() & target
        ids[to_mask] = self.mask_id
        to_random = torch.bernoulli(torch.full(ids.shape, 0.5)).bool() & target & ~to_mask
        ids[to_random] = torch.randint(self.first_word, self.vocab, ids.shape)[to_random]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def job_accelerate_mlm(run: Run) -> None:
    from accelerate import Accelerator
    from transformers import RobertaConfig, RobertaForMaskedLM

    try:
        from accelerate import DataLoaderConfiguration
        acc_kw = {"dataloader_config": DataLoaderConfiguration(non_blocking=True)}
    except ImportError:  # older Accelerate
        acc_kw = {}
    accelerator = Accelerator(cpu=not run.cuda, mixed_precision="bf16" if run.cuda else "no", **acc_kw)

    if run.tiny:
        cfg = RobertaConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=256, max_position_embeddings=130, type_vocab_size=1)
        batch, seq, n_rows, workers = 8, 64, 512, 0
    else:  # roberta-base
        cfg = RobertaConfig(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1)
        batch, seq, n_rows, workers = 32, 512, 16384, 4
    bos, pad, eos, mask_id, first_word = 0, 1, 2, cfg.vocab_size - 1, 4  # 3: <unk>
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = pad, bos, eos

    model = hf_model(RobertaForMaskedLM, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 1000))
    data = PretokenizedRows(n_rows, seq, cfg.vocab_size - 1, bos, eos, first_word)
    loader = torch.utils.data.DataLoader(
        data, batch_size=batch, shuffle=True, drop_last=True,
        collate_fn=MLMCollator(cfg.vocab_size - 1, mask_id, first_word),
        num_workers=workers, pin_memory=run.cuda, persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    if accelerator.is_main_process:
        log(f"RoBERTa {n_params(model):.0f}M parameters, {batch} x {seq} tokens per rank, "
            f"{accelerator.num_processes} processes, mixed precision {accelerator.mixed_precision}")

    step = 0
    model.train()
    while True:
        for batch_ in loader:
            out = model(**batch_)
            accelerator.backward(out.loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            run.step_done(batch_["input_ids"].shape[0] * run.world)
            if step % 100 == 0:
                loss = accelerator.gather(out.loss.detach()).mean().item()
                if accelerator.is_main_process:
                    log(f"step {step}: mlm loss {loss:.4f}  lr {sched.get_last_lr()[0]:.2e}")


# --------------------------------------------------------------------------- sft_length_sampler: sorted shards


class Conversations(torch.utils.data.Dataset):
    """Tokenized chat transcripts of very different lengths, held flat in memory."""

    def __init__(self, n: int, vocab: int, median: int, lo: int, hi: int) -> None:
        g = torch.Generator().manual_seed(4321)  # the same dataset on every rank; the sampler shards it
        self.lengths = torch.exp(torch.randn(n, generator=g) * 0.8 + math.log(median)).clamp(lo, hi).long()
        self.offsets = torch.zeros(n + 1, dtype=torch.long)
        self.offsets[1:] = torch.cumsum(self.lengths, 0)
        self.tokens = torch.randint(3, vocab, (int(self.offsets[-1]),), generator=g, dtype=torch.int32)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


class LengthGroupedShardSampler(torch.utils.data.Sampler):
    """Batches of similar length (little padding), each rank its share of the dataset.

    Sorted by length once; every epoch the batches come in a new random order."""

    def __init__(self, lengths: torch.Tensor, batch_size: int, rank: int, world: int, interleave: bool,
                 seed: int = 0) -> None:
        self.order = torch.argsort(lengths, stable=True).tolist()  # shortest first
        self.batch_size, self.rank, self.world = batch_size, rank, world
        self.interleave = interleave
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        b, r, w = self.batch_size, self.rank, self.world
        if self.interleave:
            # global batches of b * w neighbours in length order; each rank takes every w-th of them
            n = len(self.order) // (b * w) * (b * w)
            return [self.order[i:i + b * w][r::w] for i in range(0, n, b * w)]
        per_rank = len(self.order) // w
        mine = self.order[r * per_rank:(r + 1) * per_rank]  # this rank's share of the sorted list
        return [mine[i:i + b] for i in range(0, per_rank - b + 1, b)]

    def __iter__(self):
        batches = self._batches()
        g = torch.Generator().manual_seed(self.seed + self.epoch)  # the same order on every rank
        for j in torch.randperm(len(batches), generator=g).tolist():
            yield batches[j]

    def __len__(self) -> int:
        return len(self._batches())


def pad_collate(seqs: list[torch.Tensor], pad_id: int = 0, multiple: int = 8):
    """Pad to the longest sequence of the batch (rounded up to ``multiple``); labels -100 on padding."""
    longest = max(len(s) for s in seqs)
    longest = (longest + multiple - 1) // multiple * multiple
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), longest), dtype=torch.long)
    labels = torch.full((len(seqs), longest), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
        labels[i, :len(s)] = s
    return ids, mask, labels


def job_sft_length_sampler(run: Run) -> None:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    if run.tiny:
        cfg = GPTNeoXConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=512, max_position_embeddings=512, use_cache=False)
        batch, n_conv, median, lo, hi, workers = 8, 4096, 48, 8, 320, 0
    else:  # Pythia-410M
        cfg = GPTNeoXConfig(vocab_size=50304, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                            intermediate_size=4096, max_position_embeddings=2048, rotary_pct=0.25,
                            use_parallel_residual=True, use_cache=False)
        batch, n_conv, median, lo, hi, workers = 12, 40_000, 300, 32, 2048, 2
    cfg.tie_word_embeddings = False
    model = ddp(run, hf_model(GPTNeoXForCausalLM, cfg, run.dev))
    opt = adamw(run, model.parameters(), lr=2e-5, weight_decay=0.0)
    data = Conversations(n_conv, cfg.vocab_size, median, lo, hi)
    sampler = LengthGroupedShardSampler(data.lengths, batch, run.rank, run.world, interleave=run.args.fixed)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=pad_collate,
                                         num_workers=workers, pin_memory=run.cuda,
                                         persistent_workers=workers > 0)
    if run.rank == 0:
        log(f"GPT-NeoX {n_params(model):.0f}M parameters, {batch} conversations per rank, "
            f"{len(data)} conversations of {int(data.lengths.min())}-{int(data.lengths.max())} tokens")
    step, epoch = 0, 0
    while True:
        sampler.set_epoch(epoch)
        for ids, mask, labels in loader:
            ids, mask, labels = (t.to(run.dev, non_blocking=True) for t in (ids, mask, labels))
            with run.autocast():
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP: the gradient all-reduce runs in here
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss_val = loss.item()  # the running loss the progress bar shows
            step += 1
            run.step_done(ids.shape[0] * run.world)
            if step % 100 == 0 and run.rank == 0:
                log(f"step {step}: loss {loss_val:.4f}")
        epoch += 1


# --------------------------------------------------------------------------- hardneg_refresh: two scratch dirs


REFRESH_EVERY = 200
POLL_S = 0.25


class BiEncoder(nn.Module):
    """One shared encoder for queries and passages; the [CLS] vector, L2-normalized."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.encoder(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state[:, 0]
        return F.normalize(h.float(), dim=-1)

    def forward(self, q_ids: torch.Tensor, p_ids: torch.Tensor):
        return self.encode(q_ids), self.encode(p_ids)


@torch.no_grad()
def mine_hard_negatives(run: Run, model: BiEncoder, queries, passages, k: int, chunk: int) -> torch.Tensor:
    """For every query, the k passages the current model scores highest, its own positive excluded."""
    model.eval()
    with run.autocast():
        p = torch.cat([model.encode(passages[i:i + chunk]) for i in range(0, len(passages), chunk)])
        q = torch.cat([model.encode(queries[i:i + chunk]) for i in range(0, len(queries), chunk)])
    model.train()
    scores = q @ p.T
    scores.fill_diagonal_(float("-inf"))  # query i's positive is passage i
    return scores.topk(k, dim=1).indices.cpu()


def save_hard_negatives(table: torch.Tensor, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(table, tmp)
    os.replace(tmp, path)  # readers never see half a file


def wait_for_file(path: str) -> None:
    """Block until another rank has written ``path``."""
    t0 = time.monotonic()
    note = 60.0
    while not os.path.exists(path):
        time.sleep(POLL_S)
        if time.monotonic() - t0 > note:
            log(f"rank {dist.get_rank()}: still waiting for {path}")
            note += 60.0


def load_hard_negatives(path: str) -> torch.Tensor:
    wait_for_file(path)
    return torch.load(path)


def job_hardneg_refresh(run: Run) -> None:
    from transformers import BertConfig, BertModel

    if run.tiny:
        cfg = BertConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=256, max_position_embeddings=128)
        batch, q_len, p_len, pool, k, chunk, refresh_every = 16, 16, 32, 512, 4, 128, 40
    else:  # bert-base
        cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, max_position_embeddings=512)
        batch, q_len, p_len, pool, k, chunk, refresh_every = 64, 32, 128, 8192, 8, 1024, REFRESH_EVERY
    if run.args.fixed:
        box = [tempfile.mkdtemp(prefix="dpr-hardneg-") if run.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)  # every rank uses rank 0's directory
        scratch = box[0]
    else:
        scratch = tempfile.mkdtemp(prefix="dpr-hardneg-")  # the run's scratch space
    model = ddp(run, BiEncoder(hf_model(BertModel, cfg, run.dev, add_pooling_layer=False)))
    opt = adamw(run, model.parameters(), lr=2e-5, weight_decay=0.01)
    if run.rank == 0:
        log(f"bi-encoder {n_params(model):.0f}M parameters, {batch} queries per rank, {pool} passages, "
            f"scratch {scratch}")
    # the corpus: query i's positive is passage i (the same on every rank)
    g = torch.Generator(device=run.dev).manual_seed(77)
    queries = torch.randint(1, cfg.vocab_size, (pool, q_len), device=run.dev, generator=g)
    passages = torch.randint(1, cfg.vocab_size, (pool, p_len), device=run.dev, generator=g)
    hard = torch.randint(0, pool, (pool, k))  # random negatives until the first mining
    rnd = torch.Generator().manual_seed(run.rank)
    labels = torch.arange(batch, device=run.dev)
    next_refresh, saved = -1, []
    step = 0
    while True:
        idx = torch.randint(0, pool, (batch,), generator=rnd)
        neg = hard[idx, torch.randint(0, k, (batch,), generator=rnd)]
        q_ids = queries[idx.to(run.dev)]
        p_ids = passages[torch.cat([idx, neg]).to(run.dev)]
        with run.autocast():
            q, p = model(q_ids, p_ids)
        loss = F.cross_entropy(q @ p.T / 0.05, labels)  # positives on the diagonal, the rest negatives
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: the gradient all-reduce runs in here
        opt.step()
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if step == 2 * WARM_STEPS:
            next_refresh = step + run.steps_until(HANG_AFTER_S)
        if step == next_refresh:
            path = os.path.join(scratch, f"hard_negatives_{step:07d}.pt")
            if run.rank == 0:
                hard = mine_hard_negatives(run, model.module, queries, passages, k, chunk)
                save_hard_negatives(hard, path)
                saved.append(path)
                if len(saved) > 2:
                    os.remove(saved.pop(0))
                log(f"step {step}: loss {loss_val:.4f}, hard negatives re-mined -> {path}")
            else:
                hard = load_hard_negatives(path)
            next_refresh = step + refresh_every


# --------------------------------------------------------------------------- fsdp_qwen_ckpt: recompute for nothing


TRAIN_CONFIG = {  # from the 7B recipe
    "lr": 3e-4, "weight_decay": 0.1, "betas": (0.9, 0.95),
    "param_dtype": "bfloat16", "reduce_dtype": "float32",
    "activation_checkpointing": True,
}


def fully_shard_fn():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # PyTorch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def job_fsdp_qwen_ckpt(run: Run) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import Qwen2Config, Qwen2ForCausalLM

    fully_shard, MixedPrecisionPolicy = fully_shard_fn()
    train_cfg = dict(TRAIN_CONFIG)
    if run.args.fixed:
        train_cfg["activation_checkpointing"] = False
    if run.tiny:
        cfg = Qwen2Config(vocab_size=1024, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          tie_word_embeddings=False, use_cache=False)
        batch, seq = 8, 256
    else:
        cfg = Qwen2Config(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=20,
                          num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048,
                          tie_word_embeddings=False, use_cache=False)
        batch, seq = 8, 2048
    model = hf_model(Qwen2ForCausalLM, cfg, run.dev)
    n_m = n_params(model)
    model.train()
    if train_cfg["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh(run.dev.type, (run.world,))
    kw = dict(mesh=mesh)
    if run.cuda:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, train_cfg["param_dtype"]),
                                               reduce_dtype=getattr(torch, train_cfg["reduce_dtype"]))
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    opt = adamw(run, model.parameters(), lr=train_cfg["lr"], weight_decay=train_cfg["weight_decay"],
                betas=train_cfg["betas"])
    if run.rank == 0:
        log(f"Qwen2 {n_m:.0f}M parameters (FSDP2), {batch} x {seq} tokens per rank, "
            f"activation checkpointing {'on' if train_cfg['activation_checkpointing'] else 'off'}")
    g = torch.Generator(device=run.dev).manual_seed(run.rank)
    data = [torch.randint(0, cfg.vocab_size, (batch, seq), device=run.dev, generator=g) for _ in range(4)]
    step = 0
    while True:
        ids = data[step % len(data)]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()  # FSDP: reduce-scatter of the gradients in here
        opt.step()
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if step % 100 == 0 and run.rank == 0:
            log(f"step {step}: loss {loss_val:.4f}")


# --------------------------------------------------------------------------- convnext_ema: the EMA on the host


EMA_DECAY = 0.9998


@torch.no_grad()
def update_ema(ema_model: nn.Module, model: nn.Module, decay: float) -> None:
    """EMA of the weights (buffers copied), wherever ema_model lives."""
    for ema_v, model_v in zip(ema_model.state_dict().values(), model.state_dict().values()):
        model_v = model_v.detach().to(device=ema_v.device)
        if ema_v.dtype.is_floating_point:
            ema_v.copy_(decay * ema_v + (1.0 - decay) * model_v)
        else:
            ema_v.copy_(model_v)


@torch.no_grad()
def update_ema_on_device(ema_params: list[torch.Tensor], params: list[torch.Tensor], decay: float) -> None:
    """The same EMA, on the device, in one fused op."""
    torch._foreach_lerp_(ema_params, params, 1.0 - decay)


def job_convnext_ema(run: Run) -> None:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    if run.tiny:
        cfg = ConvNextConfig(depths=[1, 1, 2, 1], hidden_sizes=[16, 32, 64, 128], num_labels=10, image_size=32)
        batch, size = 16, 32
    else:  # ConvNeXt-Base
        cfg = ConvNextConfig(depths=[3, 3, 27, 3], hidden_sizes=[128, 256, 512, 1024], num_labels=1000,
                             drop_path_rate=0.1, image_size=224)
        batch, size = 64, 224
    with torch.device(run.dev):
        net = ConvNextForImageClassification(cfg)
    ema_model = ema_params = params = None
    if run.rank == 0:  # the rank that evaluates and saves keeps the EMA
        if run.args.fixed:
            ema_model = copy.deepcopy(net).eval().requires_grad_(False)
            ema_params = [p for p in ema_model.parameters()]
            params = [p for p in net.parameters()]
        else:
            ema_model = copy.deepcopy(net).to("cpu").eval().requires_grad_(False)  # model_ema_force_cpu
        log(f"rank 0: weight EMA (decay {EMA_DECAY}) on {'the GPU' if run.args.fixed else 'the CPU'}")
    model = ddp(run, net)
    opt = adamw(run, model.parameters(), lr=1e-3, weight_decay=0.05)
    if run.rank == 0:
        log(f"ConvNeXt {n_params(model):.0f}M parameters, {batch} images per rank")
    g = torch.Generator(device=run.dev).manual_seed(run.rank)
    data = [(torch.randn(batch, 3, size, size, device=run.dev, generator=g),
             torch.randint(0, cfg.num_labels, (batch,), device=run.dev, generator=g)) for _ in range(4)]
    step = 0
    while True:
        x, y = data[step % len(data)]
        with run.autocast():
            logits = model(pixel_values=x).logits
        loss = F.cross_entropy(logits.float(), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: the gradient all-reduce runs in here
        opt.step()
        if ema_model is not None:
            if run.args.fixed:
                update_ema_on_device(ema_params, params, EMA_DECAY)
            else:
                update_ema(ema_model, model.module, EMA_DECAY)
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if step % 100 == 0 and run.rank == 0:
            log(f"step {step}: loss {loss_val:.4f}")


JOBS = {"accelerate_mlm": job_accelerate_mlm, "sft_length_sampler": job_sft_length_sampler,
        "hardneg_refresh": job_hardneg_refresh, "fsdp_qwen_ckpt": job_fsdp_qwen_ckpt,
        "convnext_ema": job_convnext_ema}


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
    # A hang stays a hang for the whole run: no collective timeout before --seconds is up.
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
