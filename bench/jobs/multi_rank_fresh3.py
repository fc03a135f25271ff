"""Two-rank training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh3.py \\
        --job MODE --device cuda|cpu [--fixed]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``), gloo on the CPU (small sizes, one thread per rank,
each rank on a core of its own where there are two). ``--fixed`` is the same job once its user has
fixed the problem; the bench compares the two by the samples/s rank 0 prints.

The jobs, as their users would tell it:

``lightning_llama``
    A Llama-style causal LM (``transformers.LlamaForCausalLM`` built from a ``LlamaConfig``:
    768 wide, 12 layers, ~134M parameters, no pretrained weights) pre-trained with PyTorch
    Lightning: ``Trainer(strategy="ddp", precision="bf16-mixed")``, AdamW with a warm-up
    schedule, gradient clipping, batch 16 x 1024 tokens per rank from a ``DataLoader`` (4 workers,
    pinned memory, Lightning's ``DistributedSampler``) over a pre-tokenized corpus in memory.
    Both ranks do the same work, nothing is read back to the host per step. Nothing is wrong:
    no warning is right. ``--fixed``: the same job.

``packing_hang``
    A GPT-style LM (~270M parameters) trained with FSDP2 (``fully_shard`` per block, bf16
    params, fp32 reduce). Each rank streams its shard's pre-tokenized documents and packs them
    back to back into rows of 1024 tokens (``pack_rows``: a document that does not fit the current
    row is carried over to start the next one). A few seconds after warm-up rank 1's shard yields
    a document longer than a whole row (a 5,000-token file the tokenizer pass never truncated):
    it does not fit an empty row either, so ``pack_rows`` carries it over and retries it forever,
    a busy loop at 100 % CPU on rank 1's main thread. Rank 0 has gone on into the next step and
    waits in FSDP's all-gather at the start of the forward (on CUDA its CPU then blocks in
    ``loss.item()``) forever. ``--fixed``: documents longer than a row are split into row-sized
    pieces before packing (``split_long_docs``).

``rank0_eval``
    A BERT-base sequence classifier (``transformers.BertForSequenceClassification`` from a
    ``BertConfig``, 3 labels) fine-tuned with DDP, bf16 autocast, 32 x 512 tokens per rank. Every
    ``EVAL_EVERY`` steps rank 0 alone runs the whole dev set (``evaluate``, ``VAL_BATCHES`` batches,
    forward only, on ``model.module`` so that DDP does not get in the way) and logs its
    accuracy; rank 1 goes on to the next step and waits in its DDP collectives (the buffer
    broadcast at the start of the forward, the gradient all-reduce; on CUDA its CPU then waits in
    ``loss.item()``) until rank 0 is done. ``--fixed``: every rank evaluates its own half of the
    dev set and the counts are summed with one ``dist.all_reduce``.

``manual_allreduce``
    A 48-layer Transformer encoder tagger (pre-norm blocks with biases, 512 wide, ~160M
    parameters in ~580 tensors), bf16 autocast, 8 x 256 tokens per rank. No DDP: the training
    loop averages the gradients by hand the way the "writing distributed applications" tutorial
    does (``average_gradients``: one ``dist.all_reduce`` plus a division per parameter, after
    ``loss.backward()``). Both ranks do the same, neither is a straggler; every step ends with
    ~580 small all-reduces issued one by one, none overlapped with the backward pass.
    ``--fixed``: the model is wrapped in ``DistributedDataParallel`` (bucketed all-reduce,
    overlapped with the backward pass) and ``average_gradients`` is gone.

``act_monitor_sync``
    A ViT-L/16 image classifier (``transformers.ViTForImageClassification`` from a ``ViTConfig``,
    ~300M parameters) trained with DDP, bf16 autocast, 32 images per rank. To catch activation
    blow-ups the team runs an activation monitor on one rank (``--monitor-rank``, default the last
    rank, to keep rank 0, which logs, fast): forward hooks on every ``nn.Linear`` and
    ``nn.LayerNorm`` (~190 modules) whose ``activation_stats_hook`` reads the mean and max
    absolute activation and the standard deviation back with ``.item()``, so rank 1's CPU waits
    for its GPU ~580 times per forward and its GPU idles between modules. Rank 0 waits in the
    gradient all-reduce.
    ``--fixed``: the statistics stay on the device (``activation_stats_on_device``), are only
    taken every ``MONITOR_EVERY`` steps, and are copied to the host once per such step.

Every rank prints ``rank R ready`` once past its warm-up (a few steps, then a
``torch.cuda.synchronize()`` on CUDA); the hanging job hangs about ``HANG_AFTER_S`` seconds
after that. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks). Every process ends when its launcher dies or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "lightning_llama": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: Llama forward/backward (bf16-mixed), DDP all-reduce overlapped with backward, "
                     "AdamW, inside Lightning's Trainer.fit",
                  1: "the same"},
        "names": [],
        "fix": None,
        "note": "Lightning Trainer(strategy='ddp', precision='bf16-mixed') on a ~134M LlamaForCausalLM from "
                "config, 16 x 1024 tokens per rank, 4 DataLoader workers with pinned memory keep ahead, no "
                "per-step host read-back. Balanced ranks, busy GPUs: no warning is right.",
    },
    "packing_hang": {
        "verdict": "stuck", "rank": 1, "phase": "data",
        "where": {0: "waits in FSDP's all-gather at the start of the next forward (fully_shard pre-forward; on "
                     "CUDA its CPU then blocks in loss.item()), forever",
                  1: "pack_rows: a busy loop at 100% CPU in the main thread, carrying over and retrying a "
                     "document longer than a row forever (never reaches the next forward)"},
        "names": ["pack_rows"],
        "fix": "split (or truncate) documents longer than the row length before packing (split_long_docs), so "
               "that pack_rows never retries a document that cannot fit even an empty row",
        "note": "FSDP2 job. Rank 1's data stream yields a 5x-row-length document a few seconds after warm-up; "
                "pack_rows only closes non-empty rows and carries the document over, so it spins forever "
                "without returning. Rank 0 is blocked in the next step's FSDP all-gather waiting for rank 1.",
    },
    "rank0_eval": {
        "verdict": "straggler", "rank": 0, "phase": "compute",
        "where": {0: "evaluate: forward passes over the whole dev set on rank 0 alone (GPU busy) every "
                     "EVAL_EVERY steps",
                  1: "waits in the next training step's DDP collectives (buffer broadcast at the start of the "
                     "forward, gradient all-reduce in loss.backward(); on CUDA its CPU then waits in loss.item())"},
        "names": ["evaluate"],
        "fix": "shard the evaluation: every rank evaluates its part of the dev set (DistributedSampler or "
               "val[rank::world]) and the metrics are summed with dist.all_reduce",
        "note": "DDP BERT-base fine-tuning; 'if rank == 0: evaluate(...)' on the full dev set. Rank 0's GPU "
                "does the eval forwards while rank 1 sits in the all-reduce. The slow rank is rank 0.",
    },
    "manual_allreduce": {
        "verdict": "inefficient", "rank": None, "phase": "collective",
        "where": {0: "average_gradients: ~580 per-parameter dist.all_reduce calls (plus a division each), "
                     "one after another after loss.backward()",
                  1: "the same"},
        "names": ["DistributedDataParallel"],
        "fix": "wrap the model in DistributedDataParallel (bucketed gradient all-reduce overlapped with the "
               "backward pass) instead of all-reducing every parameter's gradient by hand after backward",
        "note": "No DDP: the tutorial-style average_gradients loop issues one small all-reduce per parameter "
                "tensor (48-layer encoder, ~580 tensors), serialized after backward. Both ranks are equal: "
                "no straggler; the fix is fewer, bucketed, overlapped collectives.",
    },
    "act_monitor_sync": {
        "verdict": "straggler", "rank": 1, "phase": "sync",
        "where": {0: "waits in the gradient all-reduce (DDP, in loss.backward(); on CUDA its CPU then waits in "
                     "loss.item())",
                  1: "activation_stats_hook (a forward hook on every Linear/LayerNorm): .item() device-to-host "
                     "reads, ~580 host syncs per forward, its GPU idle between them"},
        "names": ["activation_stats_hook"],
        "fix": "keep the activation statistics on the device (no .item() in the hook), take them only every N "
               "steps and copy them to the host once per such step (activation_stats_on_device)",
        "note": "Only the --monitor-rank (rank 1) registers the monitor's hooks; each hook reads three scalars "
                "back with .item(), so that rank's forward is serialized with its host. Rank 0 waits in the "
                "gradient all-reduce.",
    },
}

import argparse
import functools
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


def hf_model(cls, cfg, device: torch.device | None = None):
    """A transformers model from its config (no download), SDPA attention where the version has it,
    its weights created (and initialized) on ``device``."""
    with torch.device(device or "cpu"):
        try:
            return cls(cfg, attn_implementation="sdpa")
        except (TypeError, ValueError):
            cfg._attn_implementation = "sdpa"
            try:
                return cls(cfg)
            except (TypeError, ValueError):
                cfg._attn_implementation = "eager"
                return cls(cfg)


# --------------------------------------------------------------------------- lightning_llama: healthy


class TokenCorpus(torch.utils.data.Dataset):
    """A pre-tokenized corpus held in memory: fixed-length rows of token ids."""

    def __init__(self, n_rows: int, seq: int, vocab: int, virtual_len: int = 1_000_000) -> None:
        g = torch.Generator().manual_seed(1234)  # the same corpus on every rank; the sampler shards it
        self.rows = torch.randint(0, vocab, (n_rows, seq), generator=g, dtype=torch.int32)
        self.virtual_len = virtual_len

    def __len__(self) -> int:
        return self.virtual_len  # many passes over the rows: one "epoch" outlasts the run

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i % len(self.rows)].long()


def job_lightning_llama(run: Run) -> None:
    import lightning as L
    from transformers import LlamaConfig, LlamaForCausalLM

    if run.tiny:
        cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                          tie_word_embeddings=False, use_cache=False)
        batch, seq, n_rows, workers = 8, 64, 512, 0
    else:
        cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                          num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=1024,
                          tie_word_embeddings=False, use_cache=False)
        batch, seq, n_rows, workers = 16, 1024, 8192, 4

    class CausalLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = hf_model(LlamaForCausalLM, cfg, run.dev)

        def training_step(self, ids, batch_idx):
            return self.model(input_ids=ids, labels=ids).loss

        def configure_optimizers(self):
            # not fused: Lightning's mixed-precision plugin refuses gradient clipping with a fused optimizer
            opt = torch.optim.AdamW(self.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95))
            warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": warm, "interval": "step"}}

    class Throughput(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            run.step_done(batch.shape[0] * run.world)

    module = CausalLM()
    if run.rank == 0:
        n = sum(p.numel() for p in module.parameters())
        log(f"Llama {n / 1e6:.1f}M parameters, {batch} x {seq} tokens per rank")
    loader = torch.utils.data.DataLoader(
        TokenCorpus(n_rows, seq, cfg.vocab_size), batch_size=batch, shuffle=True, drop_last=True,
        num_workers=workers, pin_memory=run.cuda, persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", run.world))
    trainer = L.Trainer(
        accelerator="gpu" if run.cuda else "cpu", devices=devices, num_nodes=run.world // devices,
        strategy="ddp", precision="bf16-mixed" if run.cuda else "32-true",
        max_epochs=-1, gradient_clip_val=1.0, limit_val_batches=0, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Throughput()])
    trainer.fit(module, train_dataloaders=loader)


# --------------------------------------------------------------------------- packing_hang: a packer that spins


class Block(nn.Module):
    """A pre-norm Transformer block (causal for the LM, bidirectional for the encoder)."""

    def __init__(self, d: int, heads: int, ff: int, bias: bool = False, causal: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff, bias=bias)
        self.fc2 = nn.Linear(ff, d, bias=bias)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, 4 * d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class DocStream:
    """This rank's shard of the pre-tokenized corpus: documents of varying length, one after another
    (here: a pool of documents cycled through; rank 1's shard has one very long one in it)."""

    def __init__(self, rank: int, vocab: int, seq: int, n_docs: int = 512) -> None:
        g = torch.Generator().manual_seed(100 + rank)
        lengths = torch.exp(torch.randn(n_docs, generator=g) * 0.8 + math.log(seq / 5)).clamp(8, seq).long()
        self.docs = [torch.randint(1, vocab, (int(n),), generator=g) for n in lengths]
        self.long_doc = torch.randint(1, vocab, (5 * seq,), generator=g)
        self.long_doc_next = False  # set when the shard reaches its long document
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        if self.long_doc_next:
            self.long_doc_next = False
            return self.long_doc
        doc = self.docs[self.i % len(self.docs)]
        self.i += 1
        return doc


def split_long_docs(docs, seq: int):
    """Documents longer than a row, in row-sized pieces."""
    for doc in docs:
        if len(doc) <= seq:
            yield doc
        else:
            yield from doc.split(seq)


def pack_rows(docs, carry: list, n_rows: int, seq: int) -> list[list[torch.Tensor]]:
    """Greedy packing: documents back to back into rows of at most ``seq`` tokens. A document that
    does not fit the current row closes it and is carried over to start the next row."""
    rows: list[list[torch.Tensor]] = []
    cur: list[torch.Tensor] = []
    cur_len = 0
    while len(rows) < n_rows:
        doc = carry.pop() if carry else next(docs)
        if cur_len + len(doc) > seq:
            if cur:  # never emit an empty row
                rows.append(cur)
                cur, cur_len = [], 0
            carry.append(doc)  # first in the next row
            continue
        cur.append(doc)
        cur_len += len(doc)
    if cur:
        carry.extend(reversed(cur))  # the row in progress goes to the next batch
    return rows


def make_batch(docs, carry: list, n_rows: int, seq: int, pin: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows = pack_rows(docs, carry, n_rows, seq)
    ids = torch.zeros(n_rows, seq, dtype=torch.long)
    labels = torch.full((n_rows, seq), -100, dtype=torch.long)
    for i, row in enumerate(rows):
        t = torch.cat(row)
        ids[i, :len(t)] = t
        labels[i, :len(t) - 1] = t[1:]
    if pin:
        return ids.pin_memory(), labels.pin_memory()
    return ids, labels


def fully_shard_fn():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # PyTorch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def job_packing_hang(run: Run) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, MixedPrecisionPolicy = fully_shard_fn()
    if run.tiny:
        cfg = dict(vocab=512, d=64, heads=4, layers=2, seq=64)
        batch = 8
    else:
        cfg = dict(vocab=32768, d=1024, heads=16, layers=16, seq=1024)
        batch = 8
    seq, vocab = cfg["seq"], cfg["vocab"]
    mesh = init_device_mesh(run.dev.type, (run.world,))
    with torch.device(run.dev):
        model = GPT(**cfg)
    kw = dict(mesh=mesh)
    if run.cuda:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, **kw)
    fully_shard(model, **kw)
    if run.rank == 0:
        n = sum(p.numel() for p in model.parameters())
        log(f"GPT {n / 1e6:.0f}M parameters (FSDP2), {batch} packed rows x {seq} tokens per rank")
    opt = adamw(run, model.parameters(), lr=3e-4, weight_decay=0.1)
    stream = DocStream(run.rank, vocab, seq)
    docs = split_long_docs(stream, seq) if run.args.fixed else stream
    carry: list = []
    long_doc_at = -1
    step = 0
    while True:
        if step == long_doc_at and run.rank == 1:
            stream.long_doc_next = True  # rank 1's shard reaches its 5x-row-length document
        ids, labels = make_batch(docs, carry, batch, seq, pin=run.cuda)
        ids, labels = ids.to(run.dev, non_blocking=True), labels.to(run.dev, non_blocking=True)
        with run.autocast():
            logits = model(ids)
        loss = F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # FSDP: reduce-scatter of the gradients in here
        opt.step()
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if step == 2 * WARM_STEPS:
            long_doc_at = step + run.steps_until(HANG_AFTER_S)
        if step % 100 == 0 and run.rank == 0:
            log(f"step {step}: loss {loss_val:.4f}")


# --------------------------------------------------------------------------- rank0_eval: eval on rank 0 only


EVAL_EVERY = 20
VAL_BATCHES = 64


def classification_data(run: Run, n_batches: int, batch: int, seq: int, vocab: int, seed: int):
    """Batches of (token ids, label), already on the device."""
    g = torch.Generator(device=run.dev).manual_seed(seed)
    return [(torch.randint(0, vocab, (batch, seq), device=run.dev, generator=g),
             torch.randint(0, 3, (batch,), device=run.dev, generator=g)) for _ in range(n_batches)]


@torch.no_grad()
def evaluate(run: Run, model: nn.Module, batches) -> torch.Tensor:
    """Dev-set loss sum, correct count and example count (on the device)."""
    model.eval()
    loss_sum = torch.zeros((), device=run.dev)
    correct = torch.zeros((), device=run.dev)
    n = 0
    for ids, y in batches:
        with run.autocast():
            logits = model(input_ids=ids).logits.float()
        loss_sum += F.cross_entropy(logits, y, reduction="sum")
        correct += (logits.argmax(-1) == y).sum()
        n += len(y)
    model.train()
    return torch.stack([loss_sum, correct, torch.tensor(float(n), device=run.dev)])


def job_rank0_eval(run: Run) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    if run.tiny:
        cfg = BertConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=256, max_position_embeddings=128, num_labels=3)
        batch, seq, val_batches, eval_every = 8, 64, 32, 10
    else:
        cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, max_position_embeddings=512, num_labels=3)
        batch, seq, val_batches, eval_every = 32, 512, VAL_BATCHES, EVAL_EVERY
    model = ddp(run, hf_model(BertForSequenceClassification, cfg, run.dev))
    opt = adamw(run, model.parameters(), lr=2e-5, weight_decay=0.01)
    if run.rank == 0:
        n = sum(p.numel() for p in model.parameters())
        log(f"BERT {n / 1e6:.0f}M parameters, {batch} x {seq} tokens per rank, dev set {val_batches * batch}")
    train = classification_data(run, 4, batch, seq, cfg.vocab_size, seed=run.rank)
    dev = classification_data(run, val_batches, batch, seq, cfg.vocab_size, seed=999)  # the same on every rank
    step = 0
    while True:
        ids, y = train[step % len(train)]
        with run.autocast():
            logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: the gradient all-reduce runs in here
        opt.step()
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if step % eval_every == 0:
            if run.args.fixed:
                stats = evaluate(run, model.module, dev[run.rank::run.world])  # this rank's half
                dist.all_reduce(stats)
            elif run.rank == 0:
                stats = evaluate(run, model.module, dev)  # the whole dev set, here
            else:
                stats = None
            if run.rank == 0:
                loss_sum, correct, n = stats.tolist()
                log(f"step {step}: train loss {loss_val:.4f}  dev loss {loss_sum / n:.4f}  dev acc {correct / n:.4f}")


# --------------------------------------------------------------------------- manual_allreduce: the tutorial way


class TaggerEncoder(nn.Module):
    """A bidirectional Transformer encoder with a per-token tag head."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, n_tags: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.layers = nn.ModuleList(Block(d, heads, 4 * d, bias=True, causal=False) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, n_tags)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def sync_initial_weights(model: nn.Module) -> None:
    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def average_gradients(model: nn.Module) -> None:
    """Average the gradients over the ranks (after backward, before the optimizer step)."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def job_manual_allreduce(run: Run) -> None:
    n_tags = 17
    if run.tiny:
        cfg = dict(vocab=512, d=32, heads=2, layers=12, seq=32)
        batch = 8
    else:
        cfg = dict(vocab=16384, d=512, heads=8, layers=48, seq=256)
        batch = 8
    with torch.device(run.dev):
        model = TaggerEncoder(**cfg, n_tags=n_tags)
    if run.args.fixed:
        model = ddp(run, model)
    else:
        sync_initial_weights(model)
    opt = adamw(run, model.parameters(), lr=1e-4)
    if run.rank == 0:
        n = sum(p.numel() for p in model.parameters())
        k = sum(1 for _ in model.parameters())
        log(f"encoder {n / 1e6:.0f}M parameters in {k} tensors, {batch} x {cfg['seq']} tokens per rank")
    g = torch.Generator(device=run.dev).manual_seed(run.rank)
    data = [(torch.randint(0, cfg["vocab"], (batch, cfg["seq"]), device=run.dev, generator=g),
             torch.randint(0, n_tags, (batch, cfg["seq"]), device=run.dev, generator=g)) for _ in range(4)]
    step = 0
    while True:
        ids, tags = data[step % len(data)]
        with run.autocast():
            logits = model(ids)
        loss = F.cross_entropy(logits.float().view(-1, n_tags), tags.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # with DDP (--fixed) the bucketed all-reduce overlaps this
        if not run.args.fixed:
            average_gradients(model)
        opt.step()
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if step % 100 == 0 and run.rank == 0:
            log(f"step {step}: loss {loss_val:.4f}")


# --------------------------------------------------------------------------- act_monitor_sync: .item() in hooks


MONITOR_EVERY = 50


class ActivationMonitor:
    """Per-module activation statistics (mean and max |activation|, std), to catch blow-ups early."""

    def __init__(self, model: nn.Module, on_device: bool) -> None:
        self.stats: dict[str, dict[str, float]] = {}
        self.pending: list[tuple[str, torch.Tensor]] = []
        self.active = True
        hook = self.activation_stats_on_device if on_device else self.activation_stats_hook
        self.n_modules = 0
        for name, m in model.named_modules():
            if isinstance(m, (nn.Linear, nn.LayerNorm)):
                m.register_forward_hook(functools.partial(hook, name))
                self.n_modules += 1

    def activation_stats_hook(self, name: str, module, inputs, output) -> None:
        a = output.detach()
        rec = self.stats.setdefault(name, {"mean_abs": 0.0, "max_abs": 0.0, "std": 0.0})
        rec["mean_abs"] = 0.9 * rec["mean_abs"] + 0.1 * a.abs().mean().item()
        rec["max_abs"] = max(rec["max_abs"], a.abs().max().item())
        rec["std"] = 0.9 * rec["std"] + 0.1 * a.std().item()

    def activation_stats_on_device(self, name: str, module, inputs, output) -> None:
        if not self.active:
            return
        a = output.detach()
        self.pending.append((name, torch.stack([a.abs().mean(), a.abs().amax(), a.std()]).float()))

    def flush(self) -> None:
        """One device-to-host copy for every module's statistics of this step."""
        if not self.pending:
            return
        values = torch.stack([t for _, t in self.pending]).cpu().tolist()
        for (name, _), (mean_abs, max_abs, std) in zip(self.pending, values):
            rec = self.stats.setdefault(name, {"mean_abs": 0.0, "max_abs": 0.0, "std": 0.0})
            rec["mean_abs"] = 0.9 * rec["mean_abs"] + 0.1 * mean_abs
            rec["max_abs"] = max(rec["max_abs"], max_abs)
            rec["std"] = 0.9 * rec["std"] + 0.1 * std
        self.pending.clear()

    def worst(self) -> tuple[str, float]:
        name = max(self.stats, key=lambda k: self.stats[k]["max_abs"])
        return name, self.stats[name]["max_abs"]


def job_act_monitor_sync(run: Run) -> None:
    from transformers import ViTConfig, ViTForImageClassification

    if run.tiny:
        cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, num_labels=10)
        batch = 16
    else:  # ViT-L/16
        cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=1024, num_hidden_layers=24,
                        num_attention_heads=16, intermediate_size=4096, num_labels=1000)
        batch = 32
    monitor_rank = run.args.monitor_rank % run.world
    net = hf_model(ViTForImageClassification, cfg, run.dev)
    monitor = None
    if run.rank == monitor_rank:
        monitor = ActivationMonitor(net, on_device=run.args.fixed)
        log(f"rank {run.rank}: activation monitor on {monitor.n_modules} modules")
    model = ddp(run, net)
    opt = adamw(run, model.parameters(), lr=1e-4, weight_decay=0.05)
    if run.rank == 0:
        n = sum(p.numel() for p in model.parameters())
        log(f"ViT {n / 1e6:.0f}M parameters, {batch} images per rank")
    g = torch.Generator(device=run.dev).manual_seed(run.rank)
    data = [(torch.randn(batch, 3, cfg.image_size, cfg.image_size, device=run.dev, generator=g),
             torch.randint(0, cfg.num_labels, (batch,), device=run.dev, generator=g)) for _ in range(4)]
    step = 0
    while True:
        x, y = data[step % len(data)]
        if monitor is not None and run.args.fixed:
            monitor.active = step % MONITOR_EVERY == 0
        with run.autocast():
            logits = model(pixel_values=x).logits
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: the gradient all-reduce runs in here
        opt.step()
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if monitor is not None:
            monitor.flush()
            if step % MONITOR_EVERY == 0:
                name, worst = monitor.worst()
                log(f"step {step}: loss {loss_val:.4f}  largest |activation| {worst:.2f} in {name}")


JOBS = {"lightning_llama": job_lightning_llama, "packing_hang": job_packing_hang,
        "rank0_eval": job_rank0_eval, "manual_allreduce": job_manual_allreduce,
        "act_monitor_sync": job_act_monitor_sync}


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
    ap.add_argument("--monitor-rank", type=int, default=-1,
                    help="the rank that runs the activation monitor (default: the last rank)")
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
