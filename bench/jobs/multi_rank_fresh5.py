"""Two-rank training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh5.py \\
        --job MODE --device cuda|cpu [--fixed]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``), gloo on the CPU (small sizes, one thread per rank,
each rank on a core of its own where there are two). ``--fixed`` is the same job once its user has
fixed the problem; the bench compares the two by the samples/s rank 0 prints.

The jobs, as their users would tell it:

``trainer_t5``
    T5-base span-corruption pre-training (``transformers.T5ForConditionalGeneration`` from a
    ``T5Config``, ~220M parameters, no pretrained weights) with the Hugging Face ``Trainer``
    under torchrun: ``TrainingArguments(bf16=True, optim="adamw_torch_fused",
    ddp_find_unused_parameters=False)``, 32 examples per rank (512 input tokens, 114 target
    tokens), 4 DataLoader workers with pinned memory over a pre-tokenized corpus in memory, a
    linear warm-up schedule, logging every 100 steps, no checkpoints inside the measured run.
    Both ranks do the same work. Nothing is wrong: no warning is right. ``--fixed``: the same job.

``gpt2xl_p2p_off``
    GPT-2 XL (``transformers.GPT2LMHeadModel`` from a ``GPT2Config``, ~1.56B parameters)
    trained with DDP, bf16 autocast, fused AdamW, 4 x 1024 tokens per rank. The launch code
    calls the team's ``setup_nccl_env()`` before ``init_process_group``; it was written for
    their previous cloud VMs, where NCCL hung on peer-to-peer copies across a PCIe switch, and
    exports ``NCCL_P2P_DISABLE=1`` (and ``NCCL_IB_DISABLE=1``). On the H100 box that keeps NCCL
    off NVLink: every gradient all-reduce (6.2 GB of fp32 gradients per step) goes through host
    shared memory instead. Both ranks do the same, neither is a straggler; both spend most of the
    step waiting for the all-reduce. ``--fixed``: ``setup_nccl_env()`` no longer sets them.

``accelerate_uneven_epoch``
    Continued pre-training of an OPT-350M-style causal LM (``transformers.OPTForCausalLM`` from
    an ``OPTConfig``, ~355M parameters) with Hugging Face Accelerate
    (``Accelerator(mixed_precision="bf16")``, ``accelerator.prepare`` on the model and the
    optimizer), 8 x 1024 tokens per rank. The data is not passed through ``prepare``: each rank
    streams its own pre-tokenized shard files (``ShardStream``: files ``rank::world``), and the
    files are of different sizes, so the ranks' epochs have different numbers of batches. At
    the end of each epoch ``end_of_epoch`` calls ``accelerator.wait_for_everyone()`` and rank 0
    logs and saves. Rank 1's shard runs out first (a few seconds after warm-up): rank 1 waits in
    ``wait_for_everyone()`` (a barrier) while rank 0 trains its next batches and waits in the
    gradient all-reduce; each waits in a different collective, forever.
    ``--fixed``: the ranks agree on the number of batches per epoch (``even_out_epoch``: one
    ``dist.all_reduce`` with MIN, the remainder dropped), so every rank ends the epoch together.

``lightning_profiler_rank0``
    A ResNet-50 image classifier (``transformers.ResNetForImageClassification`` from a
    ``ResNetConfig``, ~26M parameters) trained with PyTorch Lightning:
    ``Trainer(strategy="ddp", precision="bf16-mixed")``, SGD with momentum, 128 images per rank
    from a ``DataLoader`` (6 workers, pinned memory) over uint8 images in memory, normalized on
    the GPU. For a performance review someone added ``PerfTraceCallback``: on rank 0 only ("so
    that only one trace is written") it runs ``torch.profiler.profile`` with
    ``record_shapes``, ``profile_memory`` and ``with_stack`` and a
    ``schedule(wait=1, warmup=1, active=3)``; ``save_trace`` exports each cycle's Chrome trace
    and keeps the last three. The schedule's ``repeat`` was left at its default (0: cycle for as
    long as the profiler runs), so rank 0 records every op and every five steps stalls in
    ``export_chrome_trace``, for the whole run. Rank 1 waits for rank 0 in the gradient
    all-reduce. ``--fixed``: the callback is removed.

``fsdp_cpu_offload``
    A ~440M-parameter Mistral-style causal LM (``transformers.MistralForCausalLM`` from a
    ``MistralConfig``: 1280 wide, 20 layers, GQA) pre-trained with FSDP2 (``fully_shard`` per
    decoder layer, bf16 params, fp32 reduce), 8 x 2048 tokens per rank. The script comes from
    the team's 24 GB A10 cluster, where a model like this only fit with its parameters,
    gradients and optimizer state offloaded to host memory, and still passes
    ``offload_policy=CPUOffloadPolicy()`` to ``fully_shard``. On the H100s every step copies the
    parameter shards to the GPU and the gradients back, and ``optimizer.step()`` (AdamW) runs
    on the CPU over ~220M fp32 parameters per rank, on the one thread torchrun gives each rank,
    while the GPU idles. Both ranks do the same; neither is a straggler.
    ``--fixed``: no offload policy (everything stays on the GPU, AdamW runs there).

Every rank prints ``rank R ready`` once past its warm-up (a few steps, then a
``torch.cuda.synchronize()`` on CUDA); the hanging job hangs about ``HANG_AFTER_S`` seconds
after that. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks). Every process ends when its launcher dies or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "trainer_t5": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: T5 encoder-decoder forward/backward (bf16 autocast through the Trainer), DDP all-reduce "
                     "overlapped with backward, fused AdamW; DataLoader workers collate the next batches ahead",
                  1: "the same"},
        "names": [],
        "fix": None,
        "note": "transformers Trainer (bf16, adamw_torch_fused, ddp_find_unused_parameters=False) on a ~220M "
                "T5ForConditionalGeneration from config, 32 x (512 + 114) tokens per rank, 4 DataLoader workers with "
                "pinned memory keep ahead, logging every 100 steps. Balanced ranks, busy GPUs: no warning is right.",
    },
    "gpt2xl_p2p_off": {
        "verdict": "inefficient", "rank": None, "phase": "collective",
        "where": {0: "the DDP gradient all-reduce (6.2 GB of fp32 gradients per step, in loss.backward() and at its end; "
                     "on CUDA its CPU then waits in loss.item()) over NCCL's shared-memory transport through host memory "
                     "instead of NVLink: the GPU spends most of the step waiting on NCCL kernels",
                  1: "the same"},
        "names": ["NCCL_P2P_DISABLE"],
        "fix": "stop exporting NCCL_P2P_DISABLE=1 (setup_nccl_env, before init_process_group): with peer-to-peer "
               "allowed NCCL all-reduces over NVLink, many times faster than through host memory",
        "note": "DDP GPT-2 XL (~1.56B, fp32 gradients), 4 x 1024 tokens per rank. A leftover environment setting from "
                "other hardware (visible in the processes' environment) forces NCCL onto the SHM transport. Both ranks "
                "are equal and wait on the same slow collective: no straggler; the fix is the transport.",
    },
    "accelerate_uneven_epoch": {
        "verdict": "desync", "rank": 1, "phase": "collective",
        "where": {0: "waits in the gradient all-reduce of its next training step (DDP, in accelerator.backward(); on "
                     "CUDA its CPU then blocks in loss.item()), forever",
                  1: "accelerator.wait_for_everyone() (dist.barrier) in end_of_epoch, forever: its shard's epoch ran "
                     "out of batches before rank 0's"},
        "names": ["wait_for_everyone"],
        "fix": "give every rank the same number of batches per epoch: agree on it (dist.all_reduce with MIN, the "
               "remainder dropped, even_out_epoch), or let accelerator.prepare shard one DataLoader (even_batches), or "
               "train under accelerator.join_uneven_inputs / torch.distributed.algorithms.Join",
        "note": "Accelerate job with hand-sharded per-rank data streams whose shard files differ in size. Rank 1 "
                "finishes its epoch first and enters the end-of-epoch barrier; rank 0 is still training and sits in "
                "the DDP gradient all-reduce. Two different collectives, both wait forever.",
    },
    "lightning_profiler_rank0": {
        "verdict": "straggler", "rank": 0, "phase": "cpu",
        "where": {0: "torch.profiler left running by PerfTraceCallback (rank 0 only): every op recorded with shapes, "
                     "memory and Python stacks, and every 5 steps the schedule's cycle ends in prof.step() -> save_trace "
                     "-> export_chrome_trace (serializing and writing the trace), in the main thread; its GPU idles "
                     "meanwhile",
                  1: "waits for rank 0 in the gradient all-reduce (DDP, in the backward of Lightning's training step)"},
        "names": ["profiler"],
        "fix": "stop the profiler after the steps it was meant to record (schedule(..., repeat=1), or prof.stop() "
               "/ remove PerfTraceCallback); profile a short window, not the whole run",
        "note": "Lightning DDP ResNet-50; a torch.profiler.profile with record_shapes/profile_memory/with_stack and a "
                "schedule whose repeat=0 cycles forever, on rank 0 only, exporting a Chrome trace every 5 steps. Rank "
                "0 is the slow rank; rank 1 waits in the all-reduce.",
    },
    "fsdp_cpu_offload": {
        "verdict": "inefficient", "rank": None, "phase": "cpu",
        "where": {0: "optimizer.step() on the CPU: AdamW's per-parameter loop over the CPU-resident parameter shards "
                     "(~220M fp32 parameters, one thread), plus host<->device copies of parameters and gradients around "
                     "FSDP's all-gathers and reduce-scatters; the GPU idles most of the step",
                  1: "the same"},
        "names": ["CPUOffloadPolicy"],
        "fix": "drop offload_policy=CPUOffloadPolicy() from fully_shard: the ~440M model, its gradients and AdamW state "
               "fit in a fraction of an 80 GB GPU, so they can stay there and AdamW runs on the GPU",
        "note": "FSDP2 Mistral-style LM with CPU offload copied from a small-GPU recipe: both ranks spend most of each "
                "step in the CPU optimizer step and in host<->device copies. Balanced ranks, no straggler; the GPUs "
                "are mostly idle.",
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


# --------------------------------------------------------------------------- trainer_t5: healthy


class SpanCorruptionRows(torch.utils.data.Dataset):
    """A pre-tokenized span-corruption corpus in memory: encoder inputs with sentinel tokens where
    spans were dropped, and the dropped spans as targets."""

    def __init__(self, n_rows: int, enc_len: int, dec_len: int, vocab: int, n_sentinels: int = 100,
                 virtual_len: int = 1_000_000) -> None:
        g = torch.Generator().manual_seed(2024)  # the same corpus on every rank; the sampler shards it
        words = vocab - n_sentinels
        self.inputs = torch.randint(3, words, (n_rows, enc_len), generator=g, dtype=torch.int32)
        self.targets = torch.randint(3, words, (n_rows, dec_len), generator=g, dtype=torch.int32)
        for k in range(0, min(enc_len, dec_len) - 1, 12):  # sentinels <extra_id_k>, at the top of the vocab
            self.inputs[:, k + 5] = vocab - 1 - k // 12
            self.targets[:, k] = vocab - 1 - k // 12
        self.inputs[:, -1] = 1  # </s>
        self.targets[:, -1] = 1
        self.virtual_len = virtual_len

    def __len__(self) -> int:
        return self.virtual_len  # many passes over the rows: one "epoch" outlasts the run

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i %= len(self.inputs)
        ids = self.inputs[i].long()
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.targets[i].long()}


def training_arguments(run: Run, out_dir: str, batch: int, workers: int):
    from transformers import TrainingArguments

    kw = {"output_dir": out_dir, "per_device_train_batch_size": batch, "max_steps": 10_000_000,
          "learning_rate": 3e-4, "weight_decay": 0.01, "warmup_steps": 1000, "lr_scheduler_type": "linear",
          "max_grad_norm": 1.0, "bf16": run.cuda, "optim": "adamw_torch_fused" if run.cuda else "adamw_torch",
          "logging_steps": 100, "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
          "dataloader_num_workers": workers, "dataloader_pin_memory": run.cuda,
          "dataloader_persistent_workers": workers > 0, "ddp_find_unused_parameters": False,
          "ddp_backend": "nccl" if run.cuda else "gloo", "seed": 0}
    if workers > 0:
        kw["dataloader_prefetch_factor"] = 4
    try:
        return TrainingArguments(**kw, use_cpu=not run.cuda)
    except TypeError:  # transformers < 4.34
        return TrainingArguments(**kw, no_cuda=not run.cuda)


def job_trainer_t5(run: Run) -> None:
    from transformers import (
        T5Config,
        T5ForConditionalGeneration,
        Trainer,
        TrainerCallback,
    )

    if run.tiny:
        cfg = T5Config(vocab_size=1024, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_decoder_layers=2,
                       num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        batch, enc_len, dec_len, n_rows, workers = 8, 64, 16, 512, 0
    else:  # t5-base
        cfg = T5Config(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12,
                       num_heads=12, feed_forward_proj="relu", decoder_start_token_id=0, pad_token_id=0,
                       eos_token_id=1)
        batch, enc_len, dec_len, n_rows, workers = 32, 512, 114, 16384, 4
    cfg.use_cache = False
    model = hf_model(T5ForConditionalGeneration, cfg)
    data = SpanCorruptionRows(n_rows, enc_len, dec_len, cfg.vocab_size)
    args = training_arguments(run, tempfile.mkdtemp(prefix="t5-pretrain-"), batch, workers)

    class Progress(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            run.step_done(batch * run.world)

    if run.rank == 0:
        log(f"T5 {n_params(model):.0f}M parameters, {batch} x ({enc_len} + {dec_len}) tokens per rank, "
            f"{run.world} processes, Trainer")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Progress()])
    trainer.train()


# --------------------------------------------------------------------------- gpt2xl_p2p_off: NVLink unused


def setup_nccl_env(fixed: bool) -> None:
    """The team's NCCL settings, exported before ``init_process_group`` (NCCL reads them there).

    Written for the old cloud VMs: their GPUs sat behind a PCIe switch where NCCL's peer-to-peer
    copies hung, and there was no InfiniBand."""
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    if not fixed:
        os.environ["NCCL_P2P_DISABLE"] = "1"
        os.environ["NCCL_IB_DISABLE"] = "1"


def job_gpt2xl_p2p_off(run: Run) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    if run.tiny:
        cfg = GPT2Config(vocab_size=1024, n_positions=256, n_embd=128, n_layer=4, n_head=4, bos_token_id=1023,
                         eos_token_id=1023)
        batch, seq = 4, 128
    else:  # gpt2-xl
        cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48, n_head=25)
        batch, seq = 4, 1024
    cfg.use_cache = False
    model = ddp(run, hf_model(GPT2LMHeadModel, cfg, run.dev))
    opt = adamw(run, model.parameters(), lr=1.5e-4, weight_decay=0.1, betas=(0.9, 0.95))
    if run.rank == 0:
        log(f"GPT-2 {n_params(model):.0f}M parameters, {batch} x {seq} tokens per rank, "
            f"NCCL_P2P_DISABLE={os.environ.get('NCCL_P2P_DISABLE', '-')}")
    g = torch.Generator(device=run.dev).manual_seed(run.rank)
    data = [torch.randint(0, cfg.vocab_size, (batch, seq), device=run.dev, generator=g) for _ in range(4)]
    step = 0
    while True:
        ids = data[step % len(data)]
        with run.autocast():
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: the gradient all-reduce runs in here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if step % 50 == 0 and run.rank == 0:
            log(f"step {step}: loss {loss_val:.4f}")


# --------------------------------------------------------------------------- accelerate_uneven_epoch: the end-of-epoch barrier


class ShardStream:
    """This rank's pre-tokenized shard files (files ``rank::world``), one epoch at a time: shuffled
    rows of ``seq`` tokens, cut into batches, the last partial batch dropped."""

    def __init__(self, pool: torch.Tensor, rows_per_file: list[int], rank: int, world: int, batch: int) -> None:
        self.pool, self.batch, self.rank = pool, batch, rank
        self.rows = sum(rows_per_file[rank::world])

    def __len__(self) -> int:
        return self.rows // self.batch

    def epoch(self, e: int):
        g = torch.Generator().manual_seed(1000 * e + self.rank)
        i = 0
        while i < len(self):  # (read on every batch: the bench sizes the first epoch while it runs)
            rows = torch.randint(0, len(self.pool), (self.batch,), generator=g)
            yield self.pool[rows.to(self.pool.device)]
            i += 1


def even_out_epoch(n_batches: int, device: torch.device) -> int:
    """The number of batches every rank can run this epoch: the smallest over the ranks."""
    t = torch.tensor([n_batches], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def end_of_epoch(accelerator, model, epoch: int, step: int, loss_val: float) -> None:
    accelerator.wait_for_everyone()  # every rank's epoch is done: rank 0 logs and saves
    if accelerator.is_main_process:
        state = accelerator.get_state_dict(model)
        log(f"epoch {epoch} done at step {step}: loss {loss_val:.4f}, checkpoint of {len(state)} tensors")


def job_accelerate_uneven_epoch(run: Run) -> None:
    from accelerate import Accelerator
    from transformers import OPTConfig, OPTForCausalLM

    accelerator = Accelerator(cpu=not run.cuda, mixed_precision="bf16" if run.cuda else "no")
    if run.tiny:
        cfg = OPTConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, ffn_dim=256, num_attention_heads=4,
                        max_position_embeddings=256, word_embed_proj_dim=64, do_layer_norm_before=True)
        batch, seq, pool_rows = 8, 64, 512
    else:  # opt-350m-sized, pre-LN
        cfg = OPTConfig(vocab_size=50272, hidden_size=1024, num_hidden_layers=24, ffn_dim=4096,
                        num_attention_heads=16, max_position_embeddings=2048, word_embed_proj_dim=1024,
                        do_layer_norm_before=True)
        batch, seq, pool_rows = 8, 1024, 4096
    cfg.use_cache = False
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = 1, 2, 2
    model = hf_model(OPTForCausalLM, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95))
    model, opt = accelerator.prepare(model, opt)
    g = torch.Generator().manual_seed(99)
    pool = torch.randint(3, cfg.vocab_size, (pool_rows, seq), generator=g).to(accelerator.device)
    # 16 shard files of 100k rows, the last one cut short: files rank::world, so rank 1 has less
    files = [100_000] * 15 + [100_000 - 10 * batch]
    stream = ShardStream(pool, files, run.rank, run.world, batch)
    if accelerator.is_main_process:
        log(f"OPT {n_params(model):.0f}M parameters, {batch} x {seq} tokens per rank, {run.world} processes, "
            f"mixed precision {accelerator.mixed_precision}")
    step, epoch, loss_val = 0, 0, float("nan")
    model.train()
    while True:
        for ids in stream.epoch(epoch):
            out = model(input_ids=ids, labels=ids)
            accelerator.backward(out.loss)  # DDP: the gradient all-reduce runs in here
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_val = out.loss.item()  # the running loss the progress bar shows
            step += 1
            run.step_done(ids.shape[0] * run.world)
            if step == 2 * WARM_STEPS and epoch == 0:
                # the bench: this run's first epoch ends about HANG_AFTER_S after "ready" (rank 0's
                # shard a few batches longer than rank 1's, as the files are)
                left = run.steps_until(HANG_AFTER_S)
                stream.rows = (step + left) * batch + sum(files[run.rank::run.world]) - sum(files[1::run.world])
                if run.args.fixed:
                    stream.rows = even_out_epoch(len(stream), accelerator.device) * batch
        end_of_epoch(accelerator, model, epoch, step, loss_val)
        epoch += 1
        stream.rows = sum(files[run.rank::run.world])
        if run.args.fixed:
            stream.rows = even_out_epoch(len(stream), accelerator.device) * batch


# --------------------------------------------------------------------------- lightning_profiler_rank0: the profiler never stops


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
        i %= len(self.images)
        img = self.images[i]
        if i % 2:
            img = img.flip(-1)  # random horizontal flip, as far as this corpus goes
        return img, self.labels[i]


def job_lightning_profiler_rank0(run: Run) -> None:
    import lightning as L
    from transformers import ResNetConfig, ResNetForImageClassification

    if run.tiny:
        cfg = ResNetConfig(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                           layer_type="bottleneck", num_labels=10)
        batch, size, n_images, workers = 16, 64, 256, 0
    else:  # resnet-50
        cfg = ResNetConfig(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                           layer_type="bottleneck", num_labels=1000)
        batch, size, n_images, workers = 128, 224, 2048, 6

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = ResNetForImageClassification(cfg)
            self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
            self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

        def training_step(self, batch_, batch_idx):
            x, y = batch_
            x = (x.float() - self.mean) / self.std
            logits = self.net(pixel_values=x).logits
            return F.cross_entropy(logits.float(), y, label_smoothing=0.1)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9, weight_decay=5e-5, nesterov=True)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(ImageRows(n_images, size, cfg.num_labels), batch_size=batch,
                                               shuffle=True, drop_last=True, num_workers=workers,
                                               pin_memory=run.cuda, persistent_workers=workers > 0)

    class PerfTraceCallback(L.Callback):
        """Profile a few steps on rank 0 for the performance review (only one trace is written)."""

        def __init__(self, trace_dir: str, keep: int = 3) -> None:
            self.trace_dir, self.keep = trace_dir, keep
            self.prof = None
            self.saved: list[str] = []

        def save_trace(self, prof) -> None:
            path = os.path.join(self.trace_dir, f"rank0_step{prof.step_num:07d}.pt.trace.json")
            prof.export_chrome_trace(path)
            self.saved.append(path)
            while len(self.saved) > self.keep:
                os.remove(self.saved.pop(0))

        def on_train_start(self, trainer, pl_module) -> None:
            if trainer.global_rank != 0:
                return
            from torch.profiler import ProfilerActivity, profile, schedule

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.cuda else [])
            self.prof = profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3),
                                on_trace_ready=self.save_trace, record_shapes=True, profile_memory=True,
                                with_stack=True)
            self.prof.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch_, batch_idx) -> None:
            if self.prof is not None:
                self.prof.step()

    class Progress(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch_, batch_idx) -> None:
            run.step_done(batch * run.world)

    callbacks = [Progress()]
    if not run.args.fixed:
        callbacks.insert(0, PerfTraceCallback(tempfile.mkdtemp(prefix="perf-traces-")))
    trainer = L.Trainer(accelerator="gpu" if run.cuda else "cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")),
                        num_nodes=1, strategy="ddp", precision="bf16-mixed" if run.cuda else "32-true",
                        max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)
    model = Classifier()
    if run.rank == 0:
        log(f"ResNet-50 {n_params(model):.0f}M parameters, {batch} images per rank, Lightning DDP, "
            f"profiler {'off' if run.args.fixed else 'on (rank 0)'}")
    trainer.fit(model)


# --------------------------------------------------------------------------- fsdp_cpu_offload: offload that is not needed


def fully_shard_api():
    try:
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            fully_shard,
        )
    except ImportError:  # PyTorch < 2.6
        from torch.distributed._composable.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            fully_shard,
        )
    return fully_shard, MixedPrecisionPolicy, CPUOffloadPolicy


def job_fsdp_cpu_offload(run: Run) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import MistralConfig, MistralForCausalLM

    fully_shard, MixedPrecisionPolicy, CPUOffloadPolicy = fully_shard_api()
    if run.tiny:
        cfg = MistralConfig(vocab_size=1024, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                            tie_word_embeddings=False, use_cache=False, sliding_window=None)
        batch, seq = 8, 256
    else:
        cfg = MistralConfig(vocab_size=32000, hidden_size=1280, intermediate_size=3584, num_hidden_layers=20,
                            num_attention_heads=20, num_key_value_heads=4, max_position_embeddings=2048,
                            tie_word_embeddings=False, use_cache=False, sliding_window=None)
        batch, seq = 8, 2048
    model = hf_model(MistralForCausalLM, cfg, run.dev)
    n_m = n_params(model)
    model.train()
    mesh = init_device_mesh(run.dev.type, (run.world,))
    kw = {"mesh": mesh}
    if run.cuda:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if not run.args.fixed:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=run.cuda)  # from the 24 GB cards' recipe
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))
    if run.rank == 0:
        log(f"Mistral {n_m:.0f}M parameters (FSDP2), {batch} x {seq} tokens per rank, "
            f"CPU offload {'off' if run.args.fixed else 'on'}")
    g = torch.Generator(device=run.dev).manual_seed(run.rank)
    data = [torch.randint(0, cfg.vocab_size, (batch, seq), device=run.dev, generator=g) for _ in range(4)]
    step = 0
    while True:
        ids = data[step % len(data)]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()  # FSDP: reduce-scatter of the gradients in here (then to the host, with offload)
        opt.step()
        loss_val = loss.item()  # the running loss the progress bar shows
        step += 1
        run.step_done(batch * run.world)
        if step % 50 == 0 and run.rank == 0:
            log(f"step {step}: loss {loss_val:.4f}")


JOBS = {"trainer_t5": job_trainer_t5, "gpt2xl_p2p_off": job_gpt2xl_p2p_off,
        "accelerate_uneven_epoch": job_accelerate_uneven_epoch,
        "lightning_profiler_rank0": job_lightning_profiler_rank0, "fsdp_cpu_offload": job_fsdp_cpu_offload}

# What a job's launch code does before init_process_group.
BEFORE_INIT = {"gpt2xl_p2p_off": lambda args: setup_nccl_env(args.fixed)}


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
    if args.job in BEFORE_INIT:
        BEFORE_INIT[args.job](args)
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
