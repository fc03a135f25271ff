"""Two-rank training jobs (DDP; one local SGD with gossip averaging), each with one known problem (or none), started
the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh14.py \\
        --job MODE --device cuda|cpu [--fixed] [--seconds N]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``, bf16 autocast), gloo on the CPU (small sizes, fp32, one
thread per rank, each rank on a core of its own where there are two). ``--fixed`` is the same job once its
user has fixed the problem; the bench compares the two by the samples/s rank 0 prints (the hang,
``bird_calls``, has a ``--fixed`` too, which simply keeps training). Plain PyTorch only: every model is built
in code with random weights, every data set is generated in memory. The CUDA sizes were reasoned out, not
run: no GPU was at hand.

The jobs, as their users would tell it (then what is really going on, and what ``--fixed`` should
gain; CPU figures in ``TRUTHS[mode]["measured_cpu"]`` come from a shared 2-core machine under load
from other work, where pairs of runs of one and the same job differ by tens of percent on their own):

``seismic_picks``
    P- and S-phase picking on three-component seismograms (60 s at 100 Hz): an EQTransformer-style picker
    (a strided conv encoder, 8 Transformer blocks of width 512 over the 1/16-rate sequence, a U-Net decoder
    back to the sample rate; CPU: 8 traces of 480 samples, width 64, 2 blocks; CUDA: 27M parameters, 256
    traces of 6,000 samples per rank), PhaseNet's soft labels, DDP, fused AdamW; the traces live on the
    device. Since the switch to bf16 the loss went NaN twice, so the main process now trains with
    ``torch.autograd.set_detect_anomaly(True)`` ("only on rank 0: one rank is enough to catch the op that
    makes the NaN"). "Rank 1's GPU waits most of every step; both are far below what this model did
    last month."
    Truth: straggler, rank 0, phase ``host``. In anomaly mode every op that records an autograd node
    also stores its Python traceback (``torch.fx.traceback.format_stack``: ~50-80 us at the ~30 frames
    deep of a module's forward, ~500 nodes a step under autocast), and the backward checks every node's
    outputs for NaN with a device-to-host ``.item()``: one sync per node, so rank 0's GPU idles between
    the backward's kernels while its host walks the graph. Rank 1 finishes its step early and waits for
    rank 0 in DDP's gradient all-reduce. ``--fixed``: anomaly detection off (the NaN hunt becomes a
    cheap finiteness check of the loss). Expected gain on CUDA: ~1.7x (1.4x-2.2x).

``bird_calls``
    Bird-species identification from 10 s field recordings: an Audio Spectrogram Transformer (ViT-B
    over 16 x 16 patches of 128-mel log spectrograms; CPU: 32 x 128 spectrograms, width 64, 2 layers;
    CUDA: 86M parameters, 64 clips per rank), SpecAugment, fused AdamW. The recipe comes from the team's
    cross-site runs: local SGD without a per-step gradient all-reduce, and every 200 steps (CPU: 300)
    each rank averages its weights with its ring neighbours (``gossip_average``, hand-written with
    ``dist.send`` / ``dist.recv``). "It trains for a few seconds, then nothing more is printed; both
    GPUs show 100 % utilisation and no error comes."
    Truth: stuck at the first gossip step. Both ranks call ``dist.send`` first and ``dist.recv`` only
    after it: each send waits for a receive that the other rank posts only once its own send is done,
    a cycle of blocking point-to-point calls (gloo: both hosts block in ``dist.send``; NCCL: the send
    and the receive to one peer share a communicator and a stream, the send kernels spin, and the hosts
    block in the ``.item()`` of the drift they log, or in ``dist.send`` itself while NCCL connects the
    pair). ``--fixed``: both transfers posted together with ``dist.batch_isend_irecv``.

``camera_traps``
    Species classification of camera-trap frames: a ViT-S/16 (CPU: width 64, 2 layers, 32 px crops from
    48 px frames; CUDA: 22M parameters, 256 crops of 224 px per rank from frames cached at 320 px), DDP,
    fused AdamW; the augmentation (random resized crop with antialiasing, a small rotation, flip, colour
    jitter, a blur) runs per image in the DataLoader's workers, one worker per core of the rank's block
    but one. The job pins each rank and its workers to a block of the node's cores with
    ``bind_to_local_cores``, from the cluster's job template. "Both GPUs sit at about a third of their
    load; the loaders can't keep up, yet ``top`` shows half the node's cores idle."
    Truth: inefficient, both ranks alike, phase ``data``. The template was written for ``srun`` and
    reads the task's node-local index from ``SLURM_LOCALID``; under torchrun that variable is unset, so
    both ranks take index 0 and pin themselves and the workers they fork to the same first block of
    cores (0-15 of 32 on a 2 x H200 host): 30 workers and both training loops on 16 cores, the other 16
    idle. Each rank's loop waits on its loader. ``--fixed``: the index from ``LOCAL_RANK``, each rank on
    its own block. Expected gain on CUDA: ~1.9x (1.3x-2x; the loaders stay the bottleneck after the fix,
    so the gain is the ratio of cores each rank's loader gets).

``subtitle_mt``
    Subtitle translation: Transformer-big (6 + 6 layers of width 1,024, a shared 32,000-token vocabulary
    tied to the output; CPU: width 64, 2 + 2 layers, 16 pairs of 32 tokens; CUDA: 209M parameters, 128
    pairs of 128 + 128 tokens per rank, consecutive lines of a scene joined up to the context so that
    little padding is left), label smoothing, inverse-square-root schedule, DDP, fused AdamW; the
    tokenised pairs live on the device.
    Truth: healthy: matmul-bound (~21 TFLOP per rank per step), one ~840 MB fp32 gradient all-reduce
    overlapped with the backward, balanced ranks. ``--fixed``: the same job. Expected gain: none (1.00x).

Every rank prints ``gputop-workload ready pid=P`` once past its warm-up (a few optimizer steps,
then a ``torch.cuda.synchronize()`` on CUDA): one line per rank, so two such lines mean both ranks
are training. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks; N: optimizer steps). Every process ends when its launcher dies (also
one killed while the process was still importing) or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "seismic_picks": {
        "verdict": "straggler", "rank": 0, "phase": "host",
        "where": {0: "torch.autograd.set_detect_anomaly(True), switched on only where t.rank == 0 (hunt_nans in "
                     "job_seismic_picks): in the forward every op that records an autograd node stores its Python "
                     "traceback (torch.fx.traceback.format_stack -> traceback.extract_stack/format_list, ~50-80 us "
                     "each at a module forward's ~30 frames, ~500 nodes a step); in the backward the engine checks "
                     "every node's outputs with isnan(...)._is_any_true().item(): a device-to-host sync per node, "
                     "so the GPU idles between the backward's kernels while the host walks the graph. Rank 0's "
                     "host is the bottleneck",
                  1: "trains without anomaly mode; every step it finishes early and waits in DDP's gradient "
                     "all-reduce (NCCL: GPU in the all-reduce kernel; gloo: host inside loss.backward()) for "
                     "rank 0"},
        "names": ["set_detect_anomaly", "hunt_nans", "detect_anomaly", "format_stack", "job_seismic_picks",
                  "PhasePicker"],
        "fix": "switch anomaly detection off (what --fixed does); hunt the NaN cheaply on every rank instead: test "
               "torch.isfinite(loss) every N steps (or keep a device-side flag), and at the first non-finite loss "
               "save that batch and the weights and replay the one step under detect_anomaly offline",
        "expected_gain": "about 1.7x on CUDA (1.4x-2.2x): fixed, a step per rank is ~14.5 TFLOP of block matmuls "
                         "over 96,000 tokens of width 512 (~29 ms), ~2 TFLOP of attention (~6 ms), ~1.5 TFLOP of "
                         "strided and transposed convs (~7 ms), LayerNorm/GELU/BatchNorm traffic (~12 ms) and a "
                         "108 MB gradient all-reduce overlapped: ~55 ms, the host well ahead. As-is rank 0's "
                         "forward host time is ~500 nodes x (~50-80 us traceback + ~12 us dispatch): ~30-45 ms "
                         "against ~18 ms of GPU forward; its backward runs one node at a time: ~37 ms of kernels "
                         "plus ~500 x ~30 us of launch/sync gaps (~15 ms) plus the isnan/any passes over every "
                         "gradient output (~25 GB read, ~8 ms): ~60 ms; with the optimizer ~92-107 ms a step, "
                         "which rank 1 waits for: 92 / 55 = ~1.7x",
        "measured_cpu": "two 25 s pairs under load: as-is 578 and 664 samples/s, --fixed 931 and 1,019 (1.61x, 1.53x); "
                        "one process alone, the "
                        "CPU-size step takes 15 ms without anomaly mode and 32 ms with it (151 autograd nodes, "
                        "~110 us each); rank 0's py-spy samples show traceback formatting (format_stack) in its "
                        "forward, rank 1's none",
        "note": "A debugging switch left on one rank only: anomaly mode makes that rank's host record a traceback "
                "per op in the forward and synchronise per node in the backward, and the other rank pays for it "
                "in its next all-reduce. Not a data, communication or GPU-kernel problem; not uneven work.",
        "script": "multi_rank_fresh14.py",
    },
    "bird_calls": {
        "verdict": "stuck", "rank": None, "phase": "comm",
        "where": {0: "in gossip_average at the first gossip step (step 200 on CUDA, 300 on the CPU): "
                     "dist.send(mine, dst=right) of the flat parameter vector (86M fp32, 344 MB, on CUDA) waits for "
                     "a matching receive that the other rank posts only after its own dist.send, which waits for "
                     "this rank's receive: a cycle of blocking sends. gloo: the host blocks in dist.send. NCCL: "
                     "send and recv to one peer share a communicator and stream, the send kernel spins for ever "
                     "(GPU shown 100 % busy, no progress) and the host blocks in drift.item() just after (or in "
                     "dist.send itself while NCCL connects the pair)",
                  1: "the same, symmetrically: both ranks send first"},
        "names": ["gossip_average", "dist.send", "dist.recv", "send", "parameters_to_vector", "job_bird_calls"],
        "fix": "post both transfers at once with dist.batch_isend_irecv([P2POp(isend, ...), P2POp(irecv, ...)]) and "
               "wait for both (what --fixed does); or order them by rank parity (even ranks send first, odd ranks "
               "receive first); with two ranks a dist.all_reduce of the flat vector divided by the world size does "
               "the same averaging",
        "expected_gain": "from no progress at all to training: the rates stop advancing at the first gossip step "
                         "as-is",
        "measured_cpu": "as-is the rate lines stop at steps=300 about 2.5 s after start and stay there for the rest "
                        "of 20 s and 25 s runs (both ready lines printed first); py-spy shows both ranks' main "
                        "threads in dist.send inside gossip_average; --fixed kept training (3,242 steps in 17.5 s) "
                        "and logged a gossip on both ranks every 300 steps",
        "note": "Blocking point-to-point calls made in the same order on both ends (send, then receive): the "
                "classic unsafe exchange, each send waiting for a receive that comes only after the other "
                "rank's send. A deadlock of p2p calls, not a mismatched or missing collective and not a "
                "straggler: neither rank is slow and both arrive at the same line.",
        "script": "multi_rank_fresh14.py",
    },
    "camera_traps": {
        "verdict": "inefficient", "rank": None, "phase": "data",
        "where": {0: "bind_to_local_cores reads the task's node-local index from SLURM_LOCALID, which torchrun "
                     "does not set: both ranks take index 0 and os.sched_setaffinity themselves, and the DataLoader "
                     "workers they fork (15 each on a 32-core host), to the same first block of cores (0-15); 30 "
                     "workers running CameraTrapImages.__getitem__ and both training loops share 16 cores while "
                     "the other 16 idle. The loop waits on its loader (DataLoader __next__), the GPU idle between "
                     "steps",
                  1: "the same (pinned to the same cores 0-15)"},
        "names": ["bind_to_local_cores", "SLURM_LOCALID", "sched_setaffinity", "CameraTrapImages", "__getitem__",
                  "job_camera_traps"],
        "fix": "take the node-local index from LOCAL_RANK, which torchrun sets (what --fixed does), or bind by the "
               "GPU's NUMA node; each rank then has its own 16 cores for its 15 workers. Beyond the fix: move the "
               "augmentation to the GPU, which would lift the loader limit altogether",
        "expected_gain": "about 1.9x on CUDA (1.3x-2x): one crop's augmentation costs ~4-5 ms of a core (an "
                         "antialiased resize from up to 320 px, a rotation through grid_sample, colour jitter, a "
                         "5 x 5 blur: 4.3-5.3 ms measured on this machine's cores, say ~4 ms on a server core), "
                         "while ViT-S/16 at 224 px (~28 GFLOP a crop, forward and backward) trains ~8,000-10,000 "
                         "crops/s per H100 in bf16: loader-bound both ways. Fixed, 15 workers on a rank's own 16 "
                         "cores feed ~3,700 crops/s; as-is 30 workers and two loops share 16 cores: ~1,850 per "
                         "rank. The gain is the ratio of cores: ~1.9-2x on a 2-GPU host with 16 cores per GPU (the "
                         "2 x H200 machine: 32). Only with far more cores per rank does the fixed job reach the "
                         "GPU's rate and the gain shrink (~1.15x with 64 cores per rank)",
        "measured_cpu": "two 25 s pairs under load: as-is 1,212 and 1,236 samples/s, --fixed 2,084 and 1,868 (1.72x, "
                        "1.51x); as-is both ranks, "
                        "their loader workers included, were pinned to core 0 (/proc/PID/status "
                        "Cpus_allowed_list), fixed rank 1 and its worker to core 1",
        "note": "A CPU binding written for srun (SLURM_LOCALID) run under torchrun: every rank binds itself and its "
                "loader workers to the first block of cores, so the ranks' loaders share half of the node's CPUs "
                "while the other half idles. Both ranks alike, both data-starved; not a straggler, not a "
                "worker-count setting, not a GPU or communication problem.",
        "script": "multi_rank_fresh14.py",
    },
    "subtitle_mt": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: Transformer-big in bf16 on device-resident token pairs with little padding, fused "
                     "AdamW, one gradient all-reduce per step overlapped with the backward",
                  1: "the same"},
        "names": [],
        "fix": None,
        "expected_gain": "none (1.00x): matmul-bound: every parameter meets 16,384 tokens a step (the encoder's the "
                         "source, the decoder's and the tied output layer's the target): 6 x 209M x 16,384 = ~21 "
                         "TFLOP per rank per step (~38 ms at ~550 TFLOPS on an H100), LayerNorm/ReLU/residual "
                         "traffic and the label-smoothed cross entropy over 16,384 x 32,000 logits ~15 ms, fused "
                         "AdamW over 209M parameters ~2 ms; the ~840 MB fp32 gradient all-reduce (~2.5 ms over "
                         "NVLink) overlaps the backward; ~6 % padding (scenes joined up to 128 tokens); balanced "
                         "ranks; the data on the device",
        "measured_cpu": "two 25 s pairs under load: as-is 1,076 and 648 samples/s, --fixed (the same job) 1,051 "
                        "and 584: 1.02x and 1.11x the other way, the machine's noise",
        "note": "Sequence-to-sequence training done right: data on the device, bf16, fused AdamW, little padding, "
                "balanced ranks. No warning is right.",
        "script": "multi_rank_fresh14.py",
    },
}

import argparse
import math
import os
import random
import sys
import threading
import time
from datetime import timedelta

LAUNCHER = os.getppid()  # taken before the slow imports: a launcher killed while they run is still noticed
# the cores this process may use, taken before anything pins it (the launcher's allowance for the whole node)
NODE_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))

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


# --------------------------------------------------------------------------- seismic_picks


class ConvStage(nn.Module):
    """Conv1d (stride 2), BatchNorm, GELU: one halving of the time axis."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm1d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.bn(self.conv(x)))


class UpStage(nn.Module):
    """Transposed conv (stride 2) back up the time axis, plus the encoder's features at that resolution."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose1d(c_in, c_out, 4, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm1d(c_out)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        y = self.bn(self.up(x))
        return F.gelu(y if skip is None else y + skip)


class PhasePicker(nn.Module):
    """EQTransformer-style picker: a strided conv encoder over the three components, a Transformer over the
    1/16-rate sequence, a U-Net decoder back to the sample rate; per sample the P, S and noise probabilities."""

    def __init__(self, samples: int, chans: list[int], layers: int, heads: int) -> None:
        super().__init__()
        width = chans[-1]
        self.down = nn.ModuleList(ConvStage(a, b) for a, b in zip(chans[:-1], chans[1:]))
        self.register_buffer("pos", sincos(samples // 16, width, torch.device("cpu"))[None], persistent=False)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.up = nn.ModuleList([UpStage(chans[4], chans[3]), UpStage(chans[3], chans[2]), UpStage(chans[2], chans[1]),
                                 UpStage(chans[1], chans[1] // 2)])
        self.head = nn.Conv1d(chans[1] // 2, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for stage in self.down:
            x = stage(x)
            skips.append(x)
        h = x.transpose(1, 2) + self.pos
        for block in self.blocks:
            h = block(h)
        x = self.norm(h).transpose(1, 2)
        for stage, skip in zip(self.up, [skips[2], skips[1], skips[0], None]):
            x = stage(x, skip)
        return self.head(x)  # [batch, 3, samples]: P, S, noise logits


def synthetic_waveforms(n: int, samples: int, g: torch.Generator, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """Three-component traces at 100 Hz: background noise, a P onset, a stronger S onset later, each decaying."""
    p = torch.randint(samples // 12, samples // 2, (n,), generator=g, device=dev)
    s = (p + torch.randint(samples // 30, samples // 3, (n,), generator=g, device=dev)).clamp(max=samples - 50)
    t = torch.arange(samples, device=dev)
    traces = torch.empty(n, 3, samples, device=dev, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
    for i in range(0, n, 1024):  # in chunks: the float32 temporaries of a whole shard would be large
        pi, si = p[i:i + 1024, None], s[i:i + 1024, None]
        env = (0.5 * (t >= pi) * torch.exp(-(t - pi).clamp(min=0) / 400.0)
               + 1.5 * (t >= si) * torch.exp(-(t - si).clamp(min=0) / 600.0))
        noise = torch.randn(len(pi), 3, samples, generator=g, device=dev)
        traces[i:i + 1024] = (noise * (0.1 + env[:, None])).to(traces.dtype)
    return traces, p, s


def pick_targets(p: torch.Tensor, s: torch.Tensor, samples: int, sigma: float = 20.0) -> torch.Tensor:
    """PhaseNet's soft labels: a Gaussian around each pick, noise the rest."""
    t = torch.arange(samples, device=p.device, dtype=torch.float32)
    prob_p = torch.exp(-0.5 * ((t - p[:, None]) / sigma) ** 2)
    prob_s = torch.exp(-0.5 * ((t - s[:, None]) / sigma) ** 2)
    return torch.stack([prob_p, prob_s, (1 - prob_p - prob_s).clamp(min=0)], dim=1)


def job_seismic_picks(t: Trainer) -> None:
    if t.small:
        cfg = {"traces": 1024, "samples": 480, "chans": [3, 8, 16, 32, 64], "layers": 2, "heads": 4, "batch": 8}
    else:
        cfg = {"traces": 16_384, "samples": 6000, "chans": [3, 64, 128, 256, 512], "layers": 8, "heads": 8,
               "batch": 256}
    g = torch.Generator(device=t.dev).manual_seed(210 + t.rank)  # the rank's share of the catalogue's traces
    traces, p_picks, s_picks = synthetic_waveforms(cfg["traces"], cfg["samples"], g, t.dev)
    model = t.wrap(PhasePicker(cfg["samples"], cfg["chans"], cfg["layers"], cfg["heads"]))
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 4e-4, weight_decay=0.01)
    sched = warmup_cosine(opt, 500, 80_000)
    # Since the switch to bf16 the loss went NaN twice after ~30k steps. Anomaly detection names the op that made
    # the first NaN; it is slow, so only the main process runs with it: one rank is enough to catch the culprit.
    hunt_nans = t.rank == 0 and not t.fixed
    if hunt_nans:
        torch.autograd.set_detect_anomaly(True)
    if t.rank == 0:
        log(f"phase picker {count_params(model):.1f}M parameters, {cfg['batch']} traces of {cfg['samples']} samples "
            f"per rank, anomaly detection {'on (this rank)' if hunt_nans else 'off'}")
    model.train()
    step = 0
    while True:
        order = torch.randperm(cfg["traces"], device=t.dev, generator=g)
        for b in range(0, cfg["traces"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[b:b + cfg["batch"]]
            x = traces[idx]
            x = x / x.float().std(dim=2, keepdim=True).clamp(min=1e-3).to(x.dtype)  # per-trace amplitude norm
            target = pick_targets(p_picks[idx], s_picks[idx], cfg["samples"])
            with t.autocast():
                logits = model(x)
            loss = -(target * F.log_softmax(logits.float(), dim=1)).sum(1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- bird_calls


class AudioTransformer(nn.Module):
    """AST-style: 16 x 16 patches of the log-mel spectrogram, a class token, a ViT encoder, a species head."""

    def __init__(self, mels: int, frames: int, width: int, layers: int, heads: int, species: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(1, width, 16, stride=16)
        n = (mels // 16) * (frames // 16)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, n + 1, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, species)

    def forward(self, spec: torch.Tensor) -> torch.Tensor:
        h = self.patch(spec.unsqueeze(1)).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(len(h), -1, -1), h], dim=1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h[:, 0]))


@torch.no_grad()
def gossip_average(t: Trainer, model: nn.Module, step: int) -> None:
    """Decentralised averaging (gossip SGD): swap the weights with the ring neighbours and keep the mean. No
    all-reduce: each rank only ever talks to its two neighbours, which is what lets the recipe scale across sites."""
    params = list(model.parameters())
    mine = torch.nn.utils.parameters_to_vector(params)
    theirs = torch.empty_like(mine)
    right, left = (t.rank + 1) % t.world, (t.rank - 1) % t.world
    if t.fixed:  # both transfers posted at once: neither waits for the other to finish first
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, theirs, left)]):
            req.wait()
    else:
        dist.send(mine, dst=right)
        dist.recv(theirs, src=left)
    drift = (mine - theirs).norm() / mine.norm()
    torch.nn.utils.vector_to_parameters((mine + theirs) / 2, params)
    log(f"rank {t.rank} step {step}: gossip with rank {left}, relative drift {drift.item():.4f}")


def job_bird_calls(t: Trainer) -> None:
    if t.small:
        cfg = {"clips": 1024, "mels": 32, "frames": 128, "width": 64, "layers": 2, "heads": 4, "species": 24,
               "batch": 16, "gossip_every": 300}
    else:
        cfg = {"clips": 8192, "mels": 128, "frames": 1024, "width": 768, "layers": 12, "heads": 12,
               "species": 264, "batch": 64, "gossip_every": 200}
    g = torch.Generator(device=t.dev).manual_seed(220 + t.rank)  # the rank's recorders
    species = torch.randint(0, cfg["species"], (cfg["clips"],), generator=g, device=t.dev)
    gp = torch.Generator(device=t.dev).manual_seed(225)  # each species' call pattern, shared by the ranks
    calls = torch.randn(cfg["species"], cfg["mels"], 1, generator=gp, device=t.dev)
    spec = torch.empty(cfg["clips"], cfg["mels"], cfg["frames"], device=t.dev,
                       dtype=torch.bfloat16 if t.cuda else torch.float32)
    for i in range(0, cfg["clips"], 1024):
        sl = slice(i, i + 1024)
        bursts = (torch.rand(len(species[sl]), 1, cfg["frames"], generator=g, device=t.dev) < 0.1).float()
        spec[sl] = (calls[species[sl]] * bursts + torch.randn(len(species[sl]), cfg["mels"], cfg["frames"],
                                                              generator=g, device=t.dev)).to(spec.dtype)
    torch.manual_seed(230)  # the same starting weights on every rank; after that each rank trains on its own
    model = AudioTransformer(cfg["mels"], cfg["frames"], cfg["width"], cfg["layers"], cfg["heads"],
                             cfg["species"]).to(t.dev)
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 2e-4, weight_decay=0.05)
    sched = warmup_cosine(opt, 500, 60_000)
    if t.rank == 0:
        log(f"bird-call AST {count_params(model):.1f}M parameters, {cfg['batch']} clips per rank, local SGD with "
            f"gossip averaging every {cfg['gossip_every']} steps")
    model.train()
    step = 0
    while True:
        order = torch.randperm(cfg["clips"], device=t.dev, generator=g)
        for b in range(0, cfg["clips"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[b:b + cfg["batch"]]
            x = spec[idx]
            # SpecAugment: one time mask and one frequency mask per clip
            f0 = torch.randint(0, cfg["mels"] - cfg["mels"] // 8, (len(idx), 1, 1), device=t.dev, generator=g)
            t0 = torch.randint(0, cfg["frames"] - cfg["frames"] // 8, (len(idx), 1, 1), device=t.dev, generator=g)
            fm = torch.arange(cfg["mels"], device=t.dev)[None, :, None]
            tm = torch.arange(cfg["frames"], device=t.dev)[None, None, :]
            keep = ~(((fm >= f0) & (fm < f0 + cfg["mels"] // 8)) | ((tm >= t0) & (tm < t0 + cfg["frames"] // 8)))
            with t.autocast():
                logits = model(x * keep)
            loss = F.cross_entropy(logits.float(), species[idx], label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % cfg["gossip_every"] == 0:
                gossip_average(t, model, step)


# --------------------------------------------------------------------------- camera_traps


def bind_to_local_cores(fixed: bool) -> list[int]:
    """Pin this task (and the loader workers it forks) to a block of the node's cores of its own, so that the ranks'
    workers do not trample each other's caches. From the cluster's job template, written for srun."""
    local = int(os.environ.get("LOCAL_RANK" if fixed else "SLURM_LOCALID", "0"))
    tasks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    per_task = max(1, len(NODE_CORES) // tasks)
    mine = NODE_CORES[local * per_task:(local + 1) * per_task] or NODE_CORES[-per_task:]
    try:
        os.sched_setaffinity(0, mine)
    except (AttributeError, OSError):
        return NODE_CORES
    return mine


class CameraTrapImages(torch.utils.data.Dataset):
    """The rank's shard of camera-trap frames, decoded and cached at a fixed size (uint8, CHW). ``__getitem__`` is the
    training augmentation (random resized crop, small rotation, flip, colour jitter, blur), run in the loader's
    workers; it returns uint8 crops, normalised on the GPU."""

    def __init__(self, frames: torch.Tensor, labels: torch.Tensor, crop: int) -> None:
        self.frames, self.labels, self.crop = frames, labels, crop
        k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
        self.blur = ((k[:, None] * k[None, :]) / 256.0).expand(3, 1, 5, 5).contiguous()

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.frames[i]
        _, h_img, w_img = img.shape
        area = h_img * w_img * random.uniform(0.25, 1.0)
        ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        w = min(w_img, int(round(math.sqrt(area * ratio))))
        h = min(h_img, int(round(math.sqrt(area / ratio))))
        y, x = random.randint(0, h_img - h), random.randint(0, w_img - w)
        out = F.interpolate(img[None, :, y:y + h, x:x + w].float(), size=(self.crop, self.crop), mode="bilinear",
                            antialias=True, align_corners=False)
        angle = math.radians(random.uniform(-10.0, 10.0))
        theta = torch.tensor([[math.cos(angle), -math.sin(angle), 0.0], [math.sin(angle), math.cos(angle), 0.0]])
        grid = F.affine_grid(theta[None], list(out.shape), align_corners=False)
        out = F.grid_sample(out, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
        if random.random() < 0.5:
            out = out.flip(3)
        out = out * random.uniform(0.7, 1.3)  # brightness
        mean = out.mean()
        out = (out - mean) * random.uniform(0.7, 1.3) + mean  # contrast
        gray = (0.299 * out[:, 0] + 0.587 * out[:, 1] + 0.114 * out[:, 2]).unsqueeze(1)
        out = (out - gray) * random.uniform(0.7, 1.3) + gray  # saturation
        out = F.conv2d(F.pad(out, (2, 2, 2, 2), mode="reflect"), self.blur, groups=3)  # night-shot softness
        return out[0].clamp(0, 255).round().to(torch.uint8), self.labels[i]


class ViT(nn.Module):
    def __init__(self, size: int, patch: int, width: int, layers: int, heads: int, classes: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(len(h), -1, -1), h], dim=1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h[:, 0]))


def job_camera_traps(t: Trainer) -> None:
    if t.small:
        cfg = {"frames": 1024, "stored": 48, "crop": 32, "patch": 8, "width": 64, "layers": 2, "heads": 4,
               "species": 20, "batch": 16}
    else:
        cfg = {"frames": 6144, "stored": 320, "crop": 224, "patch": 16, "width": 384, "layers": 12, "heads": 6,
               "species": 182, "batch": 256}
    cores = bind_to_local_cores(t.fixed)
    workers = max(1, len(cores) - 1)  # a core for the training loop, the rest for the loader
    g = torch.Generator().manual_seed(240 + t.rank)  # the rank's shard of the camera-trap frames
    labels = torch.randint(0, cfg["species"], (cfg["frames"],), generator=g)
    tint = torch.rand(cfg["species"], 3, 1, 1, generator=torch.Generator().manual_seed(245)) * 96
    frames = torch.randint(0, 160, (cfg["frames"], 3, cfg["stored"], cfg["stored"]), generator=g, dtype=torch.uint8)
    frames += tint[labels].to(torch.uint8)
    loader = torch.utils.data.DataLoader(
        CameraTrapImages(frames, labels, cfg["crop"]), batch_size=cfg["batch"], shuffle=True, drop_last=True,
        num_workers=workers, pin_memory=t.cuda, persistent_workers=True)
    model = t.wrap(ViT(cfg["crop"], cfg["patch"], cfg["width"], cfg["layers"], cfg["heads"], cfg["species"]))
    opt = adamw(t, model.parameters(), lr=1e-3 if t.small else 5e-4, weight_decay=0.05)
    sched = warmup_cosine(opt, 500, 50_000)
    mean = torch.tensor([0.485, 0.456, 0.406], device=t.dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=t.dev).view(1, 3, 1, 1) * 255
    log(f"rank {t.rank}: cores {cores[0]}-{cores[-1]}, {workers} loader workers")
    if t.rank == 0:
        log(f"camera-trap ViT {count_params(model):.1f}M parameters, {cfg['batch']} crops of {cfg['crop']} px per rank")
    model.train()
    step = 0
    while True:
        for x, y in loader:
            x = (x.to(t.dev, non_blocking=True).float() - mean) / std
            y = y.to(t.dev, non_blocking=True)
            with t.autocast():
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- subtitle_mt


class CrossAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k, v = (z.view(B, -1, self.heads, C // self.heads).transpose(1, 2) for z in self.kv(memory).split(C, -1))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(a.transpose(1, 2).reshape(B, T, C))


class DecoderBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
        self.self_attn = Attention(width, heads)
        self.cross = CrossAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))

    def forward(self, x, memory, self_mask, memory_mask):
        x = x + self.self_attn(self.ln1(x), self_mask)
        x = x + self.cross(self.ln2(x), memory, memory_mask)
        return x + self.mlp(self.ln3(x))


class Translator(nn.Module):
    """Transformer-big (pre-LN), source and target sharing one vocabulary and one embedding, tied to the output."""

    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int, pad: int) -> None:
        super().__init__()
        self.pad, self.scale = pad, math.sqrt(width)
        self.embed = nn.Embedding(vocab, width, padding_idx=pad)
        self.register_buffer("pos", sincos(ctx, width, torch.device("cpu")), persistent=False)
        self.encoder = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderBlock(width, heads) for _ in range(layers))
        self.ln_enc, self.ln_dec = nn.LayerNorm(width), nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        S, T = src.shape[1], tgt_in.shape[1]
        src_keep = (src != self.pad)[:, None, None, :]  # True: attend
        h = self.embed(src) * self.scale + self.pos[:S]
        for block in self.encoder:
            h = block(h, src_keep)
        memory = self.ln_enc(h)
        causal = torch.ones(T, T, dtype=torch.bool, device=src.device).tril()
        y = self.embed(tgt_in) * self.scale + self.pos[:T]
        for block in self.decoder:
            y = block(y, memory, causal, src_keep)
        return self.out(self.ln_dec(y))


def job_subtitle_mt(t: Trainer) -> None:
    if t.small:
        cfg = {"pairs": 4096, "vocab": 1024, "ctx": 32, "width": 64, "layers": 2, "heads": 4, "batch": 16}
    else:
        cfg = {"pairs": 262_144, "vocab": 32_000, "ctx": 128, "width": 1024, "layers": 6, "heads": 16, "batch": 128}
    pad, bos = 0, 1
    g = torch.Generator(device=t.dev).manual_seed(250 + t.rank)  # the rank's shard of the subtitle pairs
    # tokenised subtitles, consecutive lines of a scene joined up to the context (the model sees the dialogue around
    # a line), so little padding is left; the "translation" is a fixed token map of the source
    lengths = torch.randint(cfg["ctx"] - cfg["ctx"] // 8, cfg["ctx"] + 1, (cfg["pairs"], 1), generator=g, device=t.dev)
    src = torch.randint(2, cfg["vocab"], (cfg["pairs"], cfg["ctx"]), generator=g, device=t.dev)
    src = src.masked_fill(torch.arange(cfg["ctx"], device=t.dev) >= lengths, pad)
    mapping = torch.randperm(cfg["vocab"] - 2, generator=torch.Generator().manual_seed(255)).to(t.dev) + 2
    tgt = torch.where(src == pad, pad, mapping[(src - 2).clamp(min=0)])
    torch.manual_seed(260)
    model = t.wrap(Translator(cfg["vocab"], cfg["ctx"] + 1, cfg["width"], cfg["layers"], cfg["heads"], pad))
    opt = adamw(t, model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    warmup, peak = (200, 1e-3) if t.small else (4000, 7e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(  # inverse square root, as in the paper
        opt, lambda s: peak * min((s + 1) / warmup, math.sqrt(warmup / (s + 1))))
    if t.rank == 0:
        log(f"subtitle translator {count_params(model):.0f}M parameters, {cfg['batch']} pairs of {cfg['ctx']} tokens "
            f"per rank")
    model.train()
    step = 0
    while True:
        order = torch.randperm(cfg["pairs"], device=t.dev, generator=g)
        for b in range(0, cfg["pairs"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[b:b + cfg["batch"]]
            s, y = src[idx], tgt[idx]
            y_in = torch.cat([torch.full_like(y[:, :1], bos), y], dim=1)[:, :-1]
            with t.autocast():
                logits = model(s, y_in)
            loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), y.reshape(-1), ignore_index=pad,
                                   label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


JOBS = {"seismic_picks": job_seismic_picks, "bird_calls": job_bird_calls, "camera_traps": job_camera_traps,
        "subtitle_mt": job_subtitle_mt}


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
