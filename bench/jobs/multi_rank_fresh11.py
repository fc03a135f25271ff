"""Two-rank DDP training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh11.py \\
        --job MODE --device cuda|cpu [--fixed] [--seconds N]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``, bf16 autocast), gloo on the CPU (small sizes, fp32,
one thread per rank, each rank on a core of its own where there are two). ``--fixed`` is the same
job once its user has fixed the problem; the bench compares the two by the samples/s rank 0 prints.
Plain PyTorch DDP only: every model is built in code with random weights, every data set is
generated in memory. The CUDA sizes were reasoned out, not run: no GPU was at hand.

The jobs, as their users would tell it (then what is really going on, and what ``--fixed`` should
gain; the CPU figures were measured on a shared 2-core machine under heavy load from other work, load
average 8-19, so that pairs of 20-25 s runs of one and the same job differ by up to ~50 % on their own,
see ``TRUTHS[mode]["measured_cpu"]``):

``contract_clauses``
    Clause-type classification of commercial contracts (38 types, CUAD-style): a BERT encoder laid
    out as the Hugging Face code does it (post-LN, separate query/key/value, pooler; CPU: width 64,
    2 layers, 8 x 64 tokens per rank, 41 parameter tensors; CUDA: BERT-base shape, 110M parameters in
    201 tensors, 32 x 512 tokens per rank), DDP, AdamW, clipping. Rank 0, the only one that talks to
    the team's experiment tracker (a wandb look-alike, offline here), asks it to
    ``watch(model, log="all", log_freq=1)``: the loss spikes now and then and they want the weight and
    gradient histograms of the step it happens. "Rank 1's GPU idles a lot, rank 0's too; the job is
    far slower than the same model on one GPU was."
    Truth: straggler, rank 0, phase ``host``. ``watch`` works as ``wandb.watch`` does: a forward hook
    on the model logs every parameter, a hook on every parameter logs its gradient during the
    backward, every ``log_freq`` calls: here every step, 402 histograms (CUDA). Each one
    (``tensor_stats``) is ``isfinite``/``all``/``.item()`` twice, ``min().item()``,
    ``max().item()``, ``histc`` and ``.cpu()``: ~9 small kernels and 5 host-device syncs, ~2,000
    syncs a step, half of them inside rank 0's backward, which stalls between gradients; its
    gradient buckets reach the all-reduce late and rank 1 waits for them there. ``--fixed``:
    ``log_freq=200`` (wandb's default is 1000); one step in 200 still pays for the histograms.
    Expected gain on CUDA: fixed, ~25-30 ms a step (~9 TFLOP per rank); as-is rank 0 adds ~400
    histograms x ~150-200 us (the kernels' launches, 5 round trips to the GPU, ~50 us of Python) =
    ~60-80 ms a step: ~2.5-3.5x, at least 2x even at 100 us a histogram. CPU: 1.30-1.51x on five
    pairs (one more, run in a burst of other load, went the other way); the watch's own cost, 8.5 ms of
    CPU time a step in one process (19.3 against 11.0 ms), is the mechanism.

``voicemail_asr``
    Speech recognition of voicemail (characters, CTC): a Transformer acoustic model over 4 stacked
    80-band log-mel frames (CPU: width 64, 2 layers, 8 utterances per rank; CUDA: width 512, 12
    layers, 38M parameters, 96 utterances per rank), DDP, AdamW, clipping. The features are collated
    once into padded batches on the device. The data-prep script writes the manifest sorted by
    duration (so that length buckets need little padding); the training script gives each rank its
    contiguous slice of it (``manifest[rank * per_rank:(rank + 1) * per_rank]``), buckets the slice
    into batches of neighbours and shuffles the batches. "Both ranks run the same number of batches
    of the same size, yet rank 0's GPU sits at ~40 % while rank 1's is busy."
    Truth: straggler, rank 1, phase ``compute``. Rank 0 got the short half of the manifest (CUDA
    1.0-6.0 s, mean 3.3 s), rank 1 the long half (6.0-30 s, mean 13.4 s): ~4x the frames in every
    batch, so rank 1's forward and backward set the pace of every step and rank 0 waits in the
    gradient all-reduce. Not uneven shards: each rank has exactly as many utterances and batches.
    ``--fixed``: shard after bucketing: global buckets of ``world x batch`` neighbours in the sorted
    manifest, each rank taking its batch of each, so that at every step both ranks have audio of the
    same length. Expected gain on CUDA: as-is every step costs a long-half batch (~40 ms; mean
    13.4 s, 96 x ~340 tokens, ~7 TFLOP), fixed an average one (~25 ms, mean 8.4 s): ~1.5-1.6x
    (1.60x from a FLOP model of the actual manifest with a 5 ms floor for a step's host work; 2x is
    the bound). CPU: 1.42-1.53x in CPU time per step, measured in one process (as-is rank 1's batches
    14.1-14.3 ms, rank 0's 4.2-4.9 ms; fixed 9.0-9.7 ms on both); the two-rank runs under the load
    do not show it reliably (0.66-1.50x over 7 pairs, median 1.10x): the other work on the machine
    moves to the core the waiting rank 0 leaves idle, which a GPU cannot do.

``shelf_products``
    Recognition of products on store-shelf photos (SKU classification of crops, 3,000 SKUs): a
    ViT-B/16 (CPU: width 64, 2 layers, 16 crops of 32 px per rank; CUDA: width 768, 12 layers, 88M
    parameters, 96 crops of 224 px per rank), DDP, AdamW, clipping; the crops (uint8) live on the
    device, crop/flip/normalisation are batched tensor ops. The job's ``setup()`` is the one from the
    PyTorch DDP tutorial, ``dist.init_process_group("gloo", ...)``, kept because "gloo works
    everywhere". "Two H100s are barely faster than one; both GPUs sit at 20-30 %."
    Truth: inefficient, no straggler (both ranks alike), phase ``comm``. DDP all-reduces the ~350 MB
    of fp32 gradients every step through gloo: each 25 MB bucket is copied to pinned host memory,
    summed over TCP loopback by gloo's CPU threads and copied back; NVLink is never used, and the
    GPUs wait for the host. ``--fixed``: the NCCL backend (``init_process_group("nccl",
    device_id=...)``, as the other jobs). Expected gain on CUDA: fixed ~25-30 ms a step (~10 TFLOP
    per rank), the all-reduce (~1-2 ms over NVLink) hidden behind the backward; as-is 350 MB
    through gloo at ~2-4 GB/s of loopback (0.6-0.8 GB/s measured here on the loaded 2-core machine)
    is ~90-175 ms a step, little of it hidden behind the ~17 ms backward: ~3.5-7x, at least 2.5x
    even at 6 GB/s. CPU: cannot show it (both variants use gloo on the CPU).

``galaxy_dit``
    Class-conditional diffusion on galaxy images (10 morphology classes): a DiT-B/2 with adaLN-Zero
    over 4-channel VAE latents (CPU: width 64, 2 layers, 16 latents of 8 x 8 per rank; CUDA: width 768,
    12 layers, 130M parameters, 64 latents of 32 x 32 per rank, 256 tokens each), DDP, AdamW,
    epsilon prediction, 10 % label dropout for classifier-free guidance. The latents live on the
    device; noise, timesteps and labels are drawn there. Truth: healthy. Compute-bound (~9 TFLOP per
    rank per step, ~25-30 ms on an H100), one ~520 MB fp32 gradient all-reduce per step (~2-3 ms
    over NVLink) overlapped with the backward, a 0.8 MB positional-table buffer broadcast, balanced
    ranks (the same shapes every step). ``--fixed``: the same job. Expected gain: none (1.00x).

Every rank prints ``gputop-workload ready pid=P`` once past its warm-up (a few optimizer steps,
then a ``torch.cuda.synchronize()`` on CUDA): one line per rank, so two such lines mean both ranks
are training. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks; N: optimizer steps). Every process ends when its launcher dies (also
one killed while the process was still importing) or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "contract_clauses": {
        "verdict": "straggler", "rank": 0, "phase": "host",
        "where": {0: "Tracker.watch(log='all', log_freq=1): after every forward (log_parameters, a forward hook on the "
                     "DDP model) and for every gradient during the backward (log_gradient, a hook on each of the 201 "
                     "parameters) tensor_stats runs isfinite/all/.item() twice, min().item(), max().item(), histc and "
                     ".cpu(): ~400 histograms and ~2,000 host-device syncs a step, the backward stalled between "
                     "gradients",
                  1: "trains; waits in the gradient all-reduce for rank 0's late buckets every step (NCCL: its GPU in "
                     "the all-reduce kernel; gloo: its host inside loss.backward())"},
        "names": ["Tracker", "watch", "log_freq", "tensor_stats", "log_gradient", "log_parameters", "histc", "item"],
        "fix": "watch with a log_freq of hundreds of steps (what --fixed does: 200; wandb's default is 1000), or only "
               "gradients, or histograms off the training ranks' critical path",
        "expected_gain": "about 2.5-3.5x on CUDA: fixed, a step is ~25-30 ms (BERT-base shape, 32 x 512 tokens per "
                         "rank, ~9 TFLOP); as-is rank 0 adds ~400 histograms x ~150-200 us (~9 small kernels, 5 syncs "
                         "with a D2H copy each, ~50 us of Python) = ~60-80 ms a step, serialised with its own "
                         "backward, while rank 1 waits. At least 2x even at 100 us a histogram. Fixed, one step in "
                         "200 pays it: +0.3-0.4 ms a step",
        "measured_cpu": "1.30x, 1.35x, 1.39x, 1.43x, 1.51x on five 25-30 s pairs (as-is 119.6 / 177.3 / 356.6 / "
                        "314.5 / 503.6 samples/s, --fixed 165.9 / 229.9 / 510.7 / 475.3 / 678.9), but 0.32x on a 20 s "
                        "pair run during a burst of other load (544.4 against 174.3); in one process the watch added "
                        "8.5 ms of CPU time a step (19.3 against 11.0 ms; 82 histograms, ~100 us each)",
        "note": "Per-step weight/gradient histograms for the experiment tracker on the rank that logs: tracker hooks "
                "with host syncs in that rank's forward and backward make it the straggler. Not an evaluation or "
                "checkpoint stall: every step pays.",
    },
    "voicemail_asr": {
        "verdict": "straggler", "rank": 1, "phase": "compute",
        "where": {0: "trains on the short half of the duration-sorted manifest (CUDA 1.0-6.0 s, mean 3.3 s), then "
                     "waits in the gradient all-reduce for rank 1 every step",
                  1: "trains on the long half (CUDA 6.0-30 s, mean 13.4 s, ~4x rank 0's frames in every batch): its "
                     "forward and backward set the pace of every step"},
        "names": ["voicemail_manifest", "per_rank", "index", "VoicemailBatches", "sorted"],
        "fix": "shard after bucketing: global buckets of world x batch neighbours in the sorted manifest, each rank "
               "taking its batch of each (what --fixed does); or split the manifest by interleaving/shuffling "
               "(DistributedSampler-style) before bucketing",
        "expected_gain": "about 1.5-1.6x on CUDA: as-is every step costs a long-half batch (~40 ms: 96 x ~340 tokens, "
                         "~7 TFLOP), fixed an average one (~25 ms, both ranks alike); 1.60x from a FLOP model of the "
                         "actual manifest with a 5 ms floor for a step's host work; 2x is the bound",
        "measured_cpu": "CPU time per step in one process (the jobs' own batches, two runs): as-is rank 0 4.2-4.9 ms, "
                        "rank 1 14.1-14.3 ms a batch, fixed 9.0-9.7 ms on both ranks: 1.42-1.53x. The two-rank runs "
                        "under load average 10-19 do not show it reliably: 0.66x, 0.94x, 1.02x, 1.10x, 1.17x, 1.27x, "
                        "1.50x over 7 pairs of 25-30 s (as-is 144.6-478.9 samples/s), median 1.10x: the machine's "
                        "other work moves to the core the waiting rank 0 leaves idle",
        "note": "A length-sorted data set split into contiguous per-rank slices: equal sample and batch counts, "
                "unequal work, so one rank always has the long sequences. Not uneven shards (no rank runs out of "
                "data) and no Python on the critical path.",
    },
    "shelf_products": {
        "verdict": "inefficient", "rank": None, "phase": "comm",
        "where": {0: "DDP's gradient all-reduce through the gloo backend on CUDA tensors (the DDP tutorial's setup(): "
                     "init_process_group('gloo')): every 25 MB bucket copied to pinned host memory, summed over TCP "
                     "loopback by gloo's threads, copied back; the GPU waits",
                  1: "the same"},
        "names": ["init_process_group", "gloo", "TUTORIAL_SETUP", "backend", "nccl"],
        "fix": "use the NCCL backend for CUDA tensors (init_process_group('nccl', device_id=...): what --fixed does; "
               "or 'cuda:nccl,cpu:gloo' where CPU collectives are needed too)",
        "expected_gain": "about 3.5-7x on CUDA: fixed ~25-30 ms a step (ViT-B/16, 96 x 197 tokens per rank, ~10 "
                         "TFLOP), the ~350 MB all-reduce ~1-2 ms over NVLink and overlapped; as-is 350 MB through "
                         "gloo at ~2-4 GB/s of loopback is ~90-175 ms a step, little of it hidden behind the ~17 ms "
                         "backward. At least 2.5x even at 6 GB/s. CPU: none (both variants use gloo there)",
        "measured_cpu": "the same job both ways on the CPU: as-is 981.4 / 951.2 / 933.1 samples/s, --fixed 1147.5 / "
                        "1149.6 / 771.7 on two 25 s pairs and one 20 s pair (1.17x, 1.21x, 0.83x: the load's "
                        "noise); a gloo all-reduce of 25 / 100 MB took 40 / 129 ms here (0.6-0.8 GB/s)",
        "note": "GPU gradients all-reduced through a CPU backend (gloo): host copies and TCP loopback instead of "
                "NVLink. Not an NCCL setting: NCCL is not used at all.",
    },
    "galaxy_dit": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: DiT forward/backward on device-resident latents, one gradient all-reduce per step "
                     "overlapped with the backward",
                  1: "the same"},
        "names": [],
        "fix": None,
        "expected_gain": "none (1.00x): compute-bound (~9 TFLOP per rank per step, ~25-30 ms on an H100), ~520 MB fp32 "
                         "all-reduce (~2-3 ms over NVLink) overlapped, data on the device, balanced ranks",
        "measured_cpu": "as-is 1060.9 / 807.5 / 1803.3 samples/s, --fixed (the same job) 1259.1 / 593.7 / 1200.3 on "
                        "two 25 s pairs and one 20 s pair: 1.19x, 0.74x, 0.67x, the noise of this loaded 2-core "
                        "machine",
        "note": "Diffusion-transformer training done right: data and noise on the device, fused AdamW, balanced "
                "ranks. No warning is right.",
    },
}

import argparse
import json
import math
import os
import random
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


# --------------------------------------------------------------------------- contract_clauses


class Tracker:
    """The team's experiment-tracker client, a wandb look-alike, here in offline mode: a committed row is one JSON
    line in the run directory. ``log(..., commit=False)`` adds to the open row, as ``wandb.log`` does."""

    def __init__(self, run_dir: str, num_bins: int = 64) -> None:
        self.path = os.path.join(run_dir, "history.jsonl")
        self.num_bins = num_bins
        self.row: dict = {}
        self.step = 0

    def log(self, metrics: dict, commit: bool = True) -> None:
        self.row.update(metrics)
        if commit:
            self.row["_step"] = self.step
            with open(self.path, "a") as f:
                f.write(json.dumps(self.row) + "\n")
            self.row = {}
            self.step += 1

    def watch(self, model: nn.Module, log: str = "gradients", log_freq: int = 1000) -> None:
        """Histograms of the parameters and/or the gradients every ``log_freq`` steps, the way ``wandb.watch`` does
        it: a forward hook on the model logs every parameter, a hook on every parameter logs its gradient."""
        def due(track: list[int]) -> bool:
            track[0] += 1
            if track[0] < track[1]:
                return False
            track[0] = 0
            return True

        if log in ("parameters", "all"):
            params_track = [0, log_freq]

            def log_parameters(module: nn.Module, inputs, output) -> None:
                if due(params_track):
                    for name, p in module.named_parameters():
                        self.tensor_stats(p.detach(), "parameters/" + name)

            model.register_forward_hook(log_parameters)
        if log in ("gradients", "all"):
            for name, p in model.named_parameters():
                if not p.requires_grad:
                    continue
                track = [0, log_freq]

                def log_gradient(grad: torch.Tensor, name: str = name, track: list[int] = track) -> None:
                    if due(track):
                        self.tensor_stats(grad.detach(), "gradients/" + name)

                p.register_hook(log_gradient)

    def tensor_stats(self, tensor: torch.Tensor, name: str) -> None:
        """One histogram (64 bins between the finite minimum and maximum), as wandb's ``log_tensor_stats``."""
        flat = tensor.reshape(-1).float()
        if flat.numel() == 0 or (~torch.isfinite(flat)).all().item():
            return  # nothing finite to show
        if not torch.isfinite(flat).all():
            flat = flat[torch.isfinite(flat)]  # no way to show nan/inf in a histogram
        tmin, tmax = flat.min().item(), flat.max().item()
        if tmin > tmax:
            tmin, tmax = tmax, tmin
        counts = flat.histc(bins=self.num_bins, min=tmin, max=tmax).cpu()
        edges = torch.linspace(tmin, tmax, steps=self.num_bins + 1)
        self.log({name: {"_type": "histogram", "values": counts.tolist(), "bins": edges.tolist()}}, commit=False)


CLAUSE_TYPES = ["governing_law", "termination_for_convenience", "non_compete", "exclusivity", "ip_ownership",
                "license_grant", "cap_on_liability", "uncapped_liability", "audit_rights", "insurance",
                "warranty_duration", "most_favored_nation", "change_of_control", "anti_assignment", "renewal_term",
                "notice_period", "revenue_sharing", "minimum_commitment", "liquidated_damages", "covenant_not_to_sue",
                "third_party_beneficiary", "price_restrictions", "volume_restriction", "joint_ip", "source_code_escrow",
                "post_termination_services", "rofr_rofo", "non_disparagement", "no_solicit_of_customers",
                "no_solicit_of_employees", "competitive_restriction_exception", "affiliate_license",
                "irrevocable_license",
                "effective_date", "expiration_date", "parties", "document_name", "other"]


class ClauseBert(nn.Module):
    """A BERT encoder as the Hugging Face code lays it out (post-LN, separate query/key/value, pooler) with a
    clause-type head."""

    class Layer(nn.Module):
        def __init__(self, width: int, heads: int) -> None:
            super().__init__()
            self.attention = Attention(width, heads, fused_qkv=False)
            self.attention_norm = nn.LayerNorm(width, eps=1e-12)
            self.intermediate = nn.Linear(width, 4 * width)
            self.output = nn.Linear(4 * width, width)
            self.output_norm = nn.LayerNorm(width, eps=1e-12)
            self.dropout = nn.Dropout(0.1)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            x = self.attention_norm(x + self.dropout(self.attention(x, mask)))
            return self.output_norm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))

    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int, classes: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, width, padding_idx=0)
        self.position_embeddings = nn.Embedding(ctx, width)
        self.token_type_embeddings = nn.Embedding(2, width)
        self.embeddings_norm = nn.LayerNorm(width, eps=1e-12)
        self.layers = nn.ModuleList(self.Layer(width, heads) for _ in range(layers))
        self.pooler = nn.Linear(width, width)
        self.classifier = nn.Linear(width, classes)
        self.dropout = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = (self.word_embeddings(ids) + self.position_embeddings(pos)
             + self.token_type_embeddings(torch.zeros_like(ids)))
        x = self.dropout(self.embeddings_norm(x))
        mask = (ids != 0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return self.classifier(self.dropout(torch.tanh(self.pooler(x[:, 0]))))


def contract_corpus(n: int, ctx: int, vocab: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Clauses from the rank's share of the annotated contracts, WordPiece ids ([CLS] first, padded with 0)."""
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(1000, vocab, (n, ctx), generator=g, device=device)
    ids[:, 0] = 101
    length = torch.randint(ctx // 2, ctx + 1, (n, 1), generator=g, device=device)
    ids = ids.masked_fill(torch.arange(ctx, device=device) >= length, 0)
    labels = torch.randint(0, len(CLAUSE_TYPES), (n,), generator=g, device=device)
    return ids, labels


def job_contract_clauses(t: Trainer) -> None:
    if t.small:
        cfg = {"vocab": 4000, "ctx": 64, "width": 64, "layers": 2, "heads": 4, "batch": 8, "n": 2048}
    else:
        cfg = {"vocab": 30522, "ctx": 512, "width": 768, "layers": 12, "heads": 12, "batch": 32, "n": 8192}
    ids, labels = contract_corpus(cfg["n"], cfg["ctx"], cfg["vocab"], seed=31 + t.rank, device=t.dev)
    model = t.wrap(ClauseBert(cfg["vocab"], cfg["ctx"], cfg["width"], cfg["layers"], cfg["heads"],
                              len(CLAUSE_TYPES)))
    opt = adamw(t, model.parameters(), lr=3e-5 if not t.small else 3e-4, weight_decay=0.01)
    sched = warmup_cosine(opt, 200, 20_000)
    tracker = None
    if t.rank == 0:  # only the main process talks to the tracker
        tracker = Tracker(tempfile.mkdtemp(prefix="clauses_run_"))
        # the loss spikes now and then: watch weights and gradients at every step to catch the step it happens
        log_freq = 200 if t.fixed else 1
        tracker.watch(model, log="all", log_freq=log_freq)
        n_tensors = sum(1 for _ in model.parameters())
        log(f"contract clause BERT {count_params(model):.1f}M parameters in {n_tensors} tensors, {cfg['batch']} x "
            f"{cfg['ctx']} tokens per rank, tracker watch(log='all', log_freq={log_freq}) on rank 0")
    model.train()
    step = 0
    while True:
        for s in torch.randperm(cfg["n"] // cfg["batch"]).tolist():
            x = ids[s * cfg["batch"]:(s + 1) * cfg["batch"]]
            y = labels[s * cfg["batch"]:(s + 1) * cfg["batch"]]
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
            if step % 50 == 0 and tracker is not None:
                tracker.log({"train/loss": loss.item(), "train/lr": sched.get_last_lr()[0]})
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- voicemail_asr

ASR_CHARS = ["<blank>"] + list(" abcdefghijklmnopqrstuvwxyz'")


def voicemail_manifest(n: int, median_s: float, sigma: float, lo: float, hi: float, stack: int) -> torch.Tensor:
    """The utterances' lengths in 10 ms frames, sorted by duration as the data-prep script writes the manifest
    (so that length buckets need little padding)."""
    g = torch.Generator().manual_seed(12)
    seconds = (torch.randn(n, generator=g) * sigma + math.log(median_s)).exp().clamp(lo, hi)
    frames = (seconds * 100).long() // stack * stack
    return frames.sort().values


class VoicemailBatches:
    """This rank's batches of utterances, collated once (padded log-mel frames, CTC targets), on the device."""

    def __init__(self, frames: torch.Tensor, index: torch.Tensor, feats: int, stack: int, device: torch.device,
                 dtype: torch.dtype, seed: int) -> None:
        g = torch.Generator(device=device).manual_seed(seed)
        self.batches = []
        for rows in index.tolist():  # one batch: a list of utterance numbers in the manifest
            lens = frames[rows]
            x = torch.randn(len(rows), int(lens.max()), feats, generator=g, device=device, dtype=dtype)
            x *= (torch.arange(x.shape[1]) < lens[:, None]).to(device)[:, :, None]  # silence past the end
            tgt_lens = (lens // stack * 12 // 25).clamp(min=1)  # ~12 characters a second
            targets = torch.randint(1, len(ASR_CHARS), (int(tgt_lens.sum()),), generator=g, device=device)
            self.batches.append((x, lens.to(device), targets, tgt_lens.to(device)))


class SpeechEncoder(nn.Module):
    """A Transformer CTC acoustic model: 4 stacked frames per step (40 ms), sinusoidal positions, pre-LN blocks."""

    def __init__(self, feats: int, stack: int, width: int, layers: int, heads: int, vocab: int) -> None:
        super().__init__()
        self.stack, self.width = stack, width
        self.inp = nn.Linear(feats * stack, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        x = x.view(B, T // self.stack, C * self.stack)
        steps = lens // self.stack
        mask = (torch.arange(x.shape[1], device=x.device) < steps[:, None])[:, None, None, :]
        h = self.inp(x) + sincos(x.shape[1], self.width, x.device)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(self.norm(h)), steps


def job_voicemail_asr(t: Trainer) -> None:
    if t.small:
        cfg = {"n": 1024, "median_s": 1.5, "sigma": 0.9, "lo": 0.3, "hi": 8.0, "width": 64, "layers": 2,
               "heads": 4, "batch": 8}
    else:
        cfg = {"n": 12288, "median_s": 6.0, "sigma": 0.9, "lo": 1.0, "hi": 30.0, "width": 512, "layers": 12,
               "heads": 8, "batch": 96}
    feats, stack = 80, 4
    frames = voicemail_manifest(cfg["n"], cfg["median_s"], cfg["sigma"], cfg["lo"], cfg["hi"], stack)
    B, world = cfg["batch"], t.world
    n = len(frames) // (B * world) * (B * world)
    if t.fixed:  # global buckets of world x batch neighbours in the manifest; each rank takes its batch of each
        index = torch.arange(n).view(-1, world, B)[:, t.rank]
    else:  # each rank takes its contiguous slice of the manifest, then buckets it
        per_rank = n // world
        index = torch.arange(t.rank * per_rank, (t.rank + 1) * per_rank).view(-1, B)
    data = VoicemailBatches(frames, index, feats, stack, t.dev, torch.bfloat16 if t.cuda else torch.float32,
                            seed=50 + t.rank)
    model = t.wrap(SpeechEncoder(feats, stack, cfg["width"], cfg["layers"], cfg["heads"], len(ASR_CHARS)))
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 5e-4, betas=(0.9, 0.98), weight_decay=1e-3)
    sched = warmup_cosine(opt, 500, 100_000)
    if t.rank == 0:
        mine = frames[index.flatten()].float() / 100
        log(f"voicemail CTC encoder {count_params(model):.1f}M parameters, {len(data.batches)} batches of {B} "
            f"utterances per rank, rank 0's audio {mine.min():.1f}-{mine.max():.1f} s (mean {mine.mean():.1f} s), "
            f"manifest {frames.min() / 100:.1f}-{frames.max() / 100:.1f} s (mean {frames.float().mean() / 100:.1f} s)")
    model.train()
    step, epoch = 0, 0
    while True:
        order = torch.randperm(len(data.batches), generator=torch.Generator().manual_seed(epoch)).tolist()
        epoch += 1
        for b in order:
            x, lens, targets, tgt_lens = data.batches[b]
            with t.autocast():
                logits, steps = model(x, lens)
            log_probs = logits.float().log_softmax(-1).transpose(0, 1)
            loss = F.ctc_loss(log_probs, targets, steps, tgt_lens, blank=0, zero_infinity=True)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(B * world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: CTC loss {loss.item():.4f}")


# --------------------------------------------------------------------------- shelf_products

# The jobs whose own setup() is the PyTorch DDP tutorial's: dist.init_process_group("gloo", rank=rank,
# world_size=world_size), whatever the device ("gloo works everywhere").
TUTORIAL_SETUP = {"shelf_products"}


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


def job_shelf_products(t: Trainer) -> None:
    if t.small:
        cfg = {"n": 1024, "size": 40, "crop": 32, "patch": 8, "width": 64, "layers": 2, "heads": 4, "batch": 16,
               "skus": 300}
    else:
        cfg = {"n": 6144, "size": 240, "crop": 224, "patch": 16, "width": 768, "layers": 12, "heads": 12,
               "batch": 96, "skus": 3000}
    g = torch.Generator(device=t.dev).manual_seed(60 + t.rank)  # the rank's shelf crops, uint8, on the device
    crops = torch.randint(0, 256, (cfg["n"], 3, cfg["size"], cfg["size"]), generator=g, device=t.dev,
                          dtype=torch.uint8)
    labels = torch.randint(0, cfg["skus"], (cfg["n"],), generator=g, device=t.dev)
    mean = torch.tensor([0.485, 0.456, 0.406], device=t.dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=t.dev).view(1, 3, 1, 1) * 255
    model = t.wrap(ViT(cfg["crop"], cfg["patch"], cfg["width"], cfg["layers"], cfg["heads"], cfg["skus"]))
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 3e-4, weight_decay=0.05)
    sched = warmup_cosine(opt, 300, 50_000)
    rng = random.Random(60 + t.rank)
    if t.rank == 0:
        log(f"shelf-product ViT {count_params(model):.1f}M parameters, {cfg['batch']} crops of {cfg['crop']} px per "
            f"rank, process group backend {dist.get_backend()}")
    model.train()
    step, c = 0, cfg["crop"]
    while True:
        order = torch.randperm(cfg["n"], device=t.dev, generator=g)
        for s in range(0, cfg["n"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[s:s + cfg["batch"]]
            y0, x0 = rng.randrange(cfg["size"] - c + 1), rng.randrange(cfg["size"] - c + 1)
            x = crops[idx, :, y0:y0 + c, x0:x0 + c].float()
            flip = torch.rand(len(idx), 1, 1, 1, device=t.dev, generator=g) < 0.5
            x = (torch.where(flip, x.flip(3), x) - mean) / std
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
            if step % 50 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- galaxy_dit


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    """A DiT block with adaLN-Zero conditioning (Peebles & Xie, "Scalable Diffusion Models with Transformers")."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.ln2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c).chunk(6, dim=1)
        x = x + gate1[:, None] * self.attn(modulate(self.ln1(x), shift1, scale1))
        return x + gate2[:, None] * self.mlp(modulate(self.ln2(x), shift2, scale2))


class DiT(nn.Module):
    def __init__(self, size: int, channels: int, patch: int, width: int, layers: int, heads: int,
                 classes: int) -> None:
        super().__init__()
        self.size, self.channels, self.p = size, channels, patch
        self.embed = nn.Linear(channels * patch * patch, width)
        self.register_buffer("pos", sincos((size // patch) ** 2, width, torch.device("cpu"))[None])
        self.t_mlp = nn.Sequential(nn.Linear(256, width), nn.SiLU(), nn.Linear(width, width))
        self.y_embed = nn.Embedding(classes + 1, width)  # the last row: "no class" (classifier-free guidance)
        self.blocks = nn.ModuleList(DiTBlock(width, heads) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.final = nn.Linear(width, channels * patch * patch)
        for m in (self.final_ada[1], self.final):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        p = self.p
        x = x.view(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)
        x = self.embed(x) + self.pos
        half = 128
        freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device, dtype=torch.float32) / half)
        t_freq = torch.cat([torch.cos(t[:, None].float() * freq), torch.sin(t[:, None].float() * freq)], dim=1)
        c = self.t_mlp(t_freq) + self.y_embed(y)
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.final_ada(c).chunk(2, dim=1)
        x = self.final(modulate(self.final_norm(x), shift, scale))
        x = x.view(B, H // p, W // p, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)
        return x


def job_galaxy_dit(t: Trainer) -> None:
    if t.small:
        cfg = {"n": 1024, "size": 8, "patch": 2, "width": 64, "layers": 2, "heads": 4, "batch": 16}
    else:
        cfg = {"n": 16384, "size": 32, "patch": 2, "width": 768, "layers": 12, "heads": 12, "batch": 64}
    channels, classes = 4, 10  # 4-channel VAE latents of galaxy images; 10 morphology classes
    g = torch.Generator(device=t.dev).manual_seed(80 + t.rank)  # the rank's latents, encoded once, on the device
    latents = torch.randn(cfg["n"], channels, cfg["size"], cfg["size"], generator=g, device=t.dev) * 0.9
    morph = torch.randint(0, classes, (cfg["n"],), generator=g, device=t.dev)
    betas = torch.linspace(1e-4, 0.02, 1000, device=t.dev, dtype=torch.float64)
    alpha_bar = torch.cumprod(1 - betas, 0).float()
    model = t.wrap(DiT(cfg["size"], channels, cfg["patch"], cfg["width"], cfg["layers"], cfg["heads"], classes))
    opt = adamw(t, model.parameters(), lr=1e-4 if not t.small else 1e-3, weight_decay=0.0)
    if t.rank == 0:
        log(f"galaxy DiT {count_params(model):.1f}M parameters, {cfg['batch']} latents of {channels} x "
            f"{cfg['size']} x {cfg['size']} per rank, data on the device")
    model.train()
    step = 0
    while True:
        order = torch.randperm(cfg["n"], device=t.dev, generator=g)
        for s in range(0, cfg["n"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[s:s + cfg["batch"]]
            x0 = latents[idx]
            y = torch.where(torch.rand(len(idx), device=t.dev, generator=g) < 0.1, classes, morph[idx])
            tt = torch.randint(0, 1000, (len(idx),), device=t.dev, generator=g)
            noise = torch.randn(x0.shape, device=t.dev, generator=g)
            ab = alpha_bar[tt].view(-1, 1, 1, 1)
            xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
            with t.autocast():
                pred = model(xt, tt, y)
            loss = F.mse_loss(pred.float(), noise)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


JOBS = {"contract_clauses": job_contract_clauses, "voicemail_asr": job_voicemail_asr,
        "shelf_products": job_shelf_products, "galaxy_dit": job_galaxy_dit}


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
        if args.job in TUTORIAL_SETUP and not args.fixed:
            dist.init_process_group("gloo", timeout=timeout)  # the tutorial's setup(): CUDA tensors over gloo
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
