"""Two-rank DDP training jobs, each with one known problem (or none), started the way people start them:

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh10.py \\
        --job MODE --device cuda|cpu [--fixed] [--seconds N]

NCCL on CUDA (each rank on GPU ``LOCAL_RANK``, bf16 autocast), gloo on the CPU (small sizes, fp32,
one thread per rank, each rank on a core of its own where there are two). ``--fixed`` is the same
job once its user has fixed the problem (for the hang: the job without the hang); the bench compares
the two by the samples/s rank 0 prints. Plain PyTorch DDP only: every model is built in code with
random weights, every data set is generated in memory. The CUDA sizes were reasoned out, not run: no
GPU was at hand.

The jobs, as their users would tell it (then what is really going on, and what ``--fixed`` should
gain; the CPU figures were measured on a shared 2-core machine under heavy load from other work, load
average 8-17, so pairs of 25 s runs differ by up to ~25 % on their own, see
``TRUTHS[mode]["measured_cpu"]``):

``clinical_ner``
    Named-entity tagging of clinical notes (problems, tests, treatments, drugs; BIO tags): a
    BERT-style encoder (CPU: width 64, 2 layers, 8 x 64 tokens per rank; CUDA: BERT-base shape, width
    768, 12 layers, 107M parameters, 64 x 128 tokens per rank), DDP, AdamW, clipping. Every
    ``score_every`` steps (CPU 40, CUDA 100) rank 0 tags the dev set (512 / 2,000 sentences) and runs
    the shared task's official scorer, a script, the way its README says: ``official_f1`` starts it
    with ``subprocess.Popen(..., stdout=PIPE, stderr=PIPE)``, calls ``proc.wait()``, then reads
    stdout. "At the first dev evaluation the job freezes: both processes idle, no error. The scorer
    worked when I tried it by hand on a trained checkpoint's output."
    Truth: stuck, rank 0 (the culprit; rank 1 is the one waiting), phase ``host``. The scorer prints
    one line per mismatched entity before its JSON summary; an early model misses nearly every gold
    entity, so the report is ~160 kB (CPU) / > 1 MB (CUDA), more than the 64 kB a pipe holds. The
    scorer blocks writing to its full stdout pipe, rank 0 blocks in ``wait()`` (``waitpid``) for it
    to exit: a deadlock (the one the ``subprocess`` documentation warns of). Rank 1 has gone on into
    the next step and waits for ever in its gradient all-reduce (gloo: the host blocked inside
    ``loss.backward()``; NCCL: its GPU in the all-reduce, its host blocked once the launch queue
    fills). CUDA: the hang starts at step 100, ~1.5-2 s after the ready line (~15-20 ms a step).
    ``--fixed``: ``subprocess.run(..., capture_output=True)``, which reads both pipes while it waits
    (``communicate``); the job runs on, scoring every ``score_every`` steps.

``call_intents``
    Intent classification of call-centre transcripts (24 intents): a Transformer encoder (CPU: width
    32, 1 layer, 32 calls x 48 tokens per rank; CUDA: width 768, 6 layers, 45M parameters, 64 calls
    x 256 tokens per rank) over the transcription vendor's JSON-lines export (one JSON object per
    call, 12-24 turns), tokenized on the fly by a pure-Python WordPiece. DDP, AdamW, clipping. The
    export is "one stream", so rank 0 reads it: each step it takes the next ``world x batch`` calls,
    parses and tokenizes them in its main process (``encode_call``, ``pad_calls``) and deals them
    out with ``dist.scatter``. "Rank 1 is idle half the time; the second GPU barely helps."
    Truth: straggler, rank 0, phase ``data``. Rank 0 tokenizes both ranks' batches (~580 word
    pieces a call, ~0.5-0.9 ms of Python each) before every step; rank 1 waits in ``dist.scatter``
    for its share, every step, and its GPU idles. ``--fixed``: every rank reads its own part of the
    export (``CallShard``, an ``IterableDataset`` split by rank and loader worker) through its own
    ``DataLoader`` (CUDA: 6 workers per rank; CPU: none, one core per rank). Expected gain on CUDA:
    as-is ~65-115 ms of tokenization on rank 0 per step (128 calls) against a ~12-18 ms GPU step
    (~4.4 TFLOP per rank); fixed, each rank's workers deliver a batch every ~5-10 ms and the GPU
    step sets the pace: ~4-7x (2x of it from rank 0 no longer tokenizing rank 1's half, the rest from
    the workers). CPU: 1.21-1.27x measured (rank 0's second batch only).

``chess_lm``
    A chess-move language model (UCI move tokens, 1,968 of them) for an engine's policy prior: a
    deep, narrow GPT (CPU: width 32, 32 layers, 4 x 32 moves per rank; CUDA: width 512, 32 layers,
    103M parameters in 517 tensors (separate q/k/v/o projections with biases), 16 x 512 moves per
    rank), DDP, trained with Lion, the optimizer from "Symbolic Discovery of Optimization
    Algorithms", copied from its reference code: ``Lion.step`` loops over the parameters in Python
    and does 8 small tensor operations on each. "Both GPUs show 40-50 % utilization; the kernels in
    a profile are tiny."
    Truth: inefficient, no straggler (both ranks alike), phase ``host``. The optimizer step is ~4,100
    kernel launches of a few microseconds of GPU work each (517 tensors x ``mul_``, ``clone``,
    ``mul_``, ``add``, ``sign_``, ``add_``, ``mul_``, ``add_``): ~35-40 ms of Python and launches per
    step, while forward and backward take ~15-20 ms of GPU time. The host, not the GPU, sets the
    pace. ``--fixed``: ``Lion(foreach=True)``: the same update (the same losses, step for step) with
    one ``torch._foreach_*`` call per operation over all 517 tensors. Expected gain on CUDA: as-is
    ~45-50 ms a step (host-bound), fixed ~20 ms (GPU-bound: ~6 TFLOP per rank plus ~3 ms of
    optimizer memory traffic, host ~10-12 ms): ~2-2.5x; >= 1.5x even at 5 us a launch. CPU: cannot
    show it (a CPU op's "launch" is its work; foreach on the CPU loops over the tensors too).

``land_cover``
    Land-cover classification of 4-band (RGB + near-infrared) satellite patches (10 classes): a
    ResNet-50 layout (CPU: width 16, one block per stage, 16 crops of 32 px per rank; CUDA: width 64,
    [3, 4, 6, 3] bottlenecks, 23.5M parameters, 192 crops of 160 px per rank), channels-last, DDP,
    SGD with Nesterov momentum, label smoothing. The patches (uint8) live on the device; crop, flip
    and normalisation are batched tensor ops. Truth: healthy. Compute-bound (~1.2 TFLOP of
    convolutions per rank per step, ~35 ms on an H100), one ~94 MB fp32 gradient all-reduce per step
    (~1 ms over NVLink) overlapped with the backward, a ~0.2 MB BatchNorm buffer broadcast, balanced
    ranks. ``--fixed``: the same job. Expected gain: none (1.00x).

Every rank prints ``gputop-workload ready pid=P`` once past its warm-up (a few optimizer steps,
then a ``torch.cuda.synchronize()`` on CUDA): one line per rank, so two such lines mean both ranks
are training. Rank 0 prints ``gputop-workload rate t=T steps=N samples=M`` every half second
(M: samples over both ranks; N: optimizer steps). Every process ends when its launcher dies (also
one killed while the process was still importing) or after ``--seconds``.

``TRUTHS`` says, per job, what a right diagnosis is.
"""

from __future__ import annotations

TRUTHS = {
    "clinical_ner": {
        "verdict": "stuck", "rank": 0, "phase": "host",
        "where": {0: "blocked for ever in official_f1: subprocess.Popen(stdout=PIPE, stderr=PIPE) then proc.wait() "
                     "(waitpid) on the official scorer (score.py), which is itself blocked writing its > 64 kB "
                     "report to the full stdout pipe nobody reads",
                  1: "waits for ever in the next step's DDP gradient all-reduce (gloo: host blocked inside "
                     "loss.backward(); NCCL: GPU in the all-reduce, host blocked once the launch queue fills)"},
        "names": ["official_f1", "Popen", "wait", "PIPE", "score.py", "communicate"],
        "fix": "read the pipes while waiting: proc.communicate() or subprocess.run(capture_output=True) (what --fixed "
               "does), or send the scorer's report to a file; better still, score off the training ranks",
        "expected_gain": "no hang (CUDA: the hang starts at step 100, ~1.5-2 s after the ready line, at the first "
                         "dev evaluation; the report is > 1 MB, far over the 64 kB pipe buffer)",
        "measured_cpu": "hangs at step 40 on every as-is run (3 runs): last progress 8.1 s / 12.1 s after the first rate "
                        "line (~2-3 s after the ready lines), then none for the remaining 16.2 s / 11.6 s of the 25 s "
                        "run; rank 0 in do_wait, score.py in anon_pipe_write, rank 1 in a futex (gloo); the scorer's "
                        "report was 164 kB. --fixed: 76 and 128 steps in 25 s (scores at steps 40, 80, 120, "
                        "~1.5 s each), 94.7 and 103.3 samples/s, no hang. Killing the launcher (SIGKILL) while hung "
                        "or while the ranks import: ranks and scorer gone within 3 s",
        "note": "A subprocess started with stdout/stderr pipes and waited for with wait(): once its output outgrows "
                "the pipe buffer, child and parent wait on each other. Only rank 0 runs it; the other rank hangs in "
                "the next collective. No error, no timeout within the run.",
    },
    "call_intents": {
        "verdict": "straggler", "rank": 0, "phase": "data",
        "where": {0: "parses and tokenizes the next world x batch calls of the export in its main process every step "
                     "(encode_call: json.loads + WordPiece.word, pad_calls) for both ranks, then dist.scatter",
                  1: "waits in dist.scatter (src=0) for its batch every step; then trains (its gradient all-reduce "
                     "waits little)"},
        "names": ["encode_call", "WordPiece", "pad_calls", "scatter", "export_reader"],
        "fix": "let every rank read and tokenize its own part of the export (an IterableDataset split by rank and "
               "loader worker, DataLoader workers: what --fixed does), or tokenize the export once offline",
        "expected_gain": "about 4-7x on CUDA: as-is rank 0 tokenizes 128 calls (~580 word pieces each, ~0.5-0.9 ms of "
                         "Python a call: ~65-115 ms) before every ~12-18 ms GPU step (~4.4 TFLOP per rank) while rank "
                         "1 waits; fixed, 6 workers per rank deliver a batch every ~5-10 ms and the GPU sets the pace. "
                         "2x of it is rank 0 no longer doing rank 1's half; at least 2x in any case",
        "measured_cpu": "1.27x and 1.21x on two 25 s pairs (as-is 299.4 / 394.6 samples/s, 76 / 92 steps; --fixed "
                        "381.0 / 476.8 samples/s, 110 / 169 steps; no loader workers on the CPU, so only rank 0's second "
                        "batch is removed: ~14 ms of tokenization per 16 calls against a ~20 ms step measured alone); "
                        "a py-spy dump caught rank 1 in dist.scatter",
        "note": "Centralised data loading: one rank reads, tokenizes and scatters every rank's batch, so the others "
                "wait for it in the scatter every step. Not uneven shards: each rank gets the same number of calls.",
    },
    "chess_lm": {
        "verdict": "inefficient", "rank": None, "phase": "host",
        "where": {0: "Lion.step: a Python loop over 517 parameter tensors, 8 small tensor ops each (mul_, clone, mul_, "
                     "add, sign_, add_, mul_, add_): ~4,100 launches a step; the GPU waits for the host",
                  1: "the same"},
        "names": ["Lion", "step", "foreach", "_foreach_", "exp_avg"],
        "fix": "do the update with multi-tensor ops: torch._foreach_* over all the parameters (what --fixed does, "
               "Lion(foreach=True)), or a fused optimizer kernel",
        "expected_gain": "about 2-2.5x on CUDA: as-is ~35-40 ms of Python + launches in the optimizer (517 tensors x 8 "
                         "ops at ~8 us, plus the loop's bookkeeping) on top of ~10 ms of forward/backward host time: "
                         "~45-50 ms a step, host-bound; fixed ~20 ms, GPU-bound (~6 TFLOP per rank, ~3 ms of optimizer "
                         "memory traffic in both). >= 1.5x even at 5 us a launch. CPU: ~1.0x (nothing to overlap)",
        "measured_cpu": "no difference to see on the CPU, as expected: two 25 s pairs 21.8 vs 21.4 and 41.8 vs 26.8 "
                        "samples/s (as-is vs --fixed), i.e. the machine's noise; in one process the optimizer step "
                        "alone took 9.3-9.6 ms as a loop and 5.2-5.3 ms with foreach (517 tensors), within a ~100 ms "
                        "CPU step. Losses identical step for step (7.6906 at step 100 with the 8-layer trial size)",
        "note": "A hand-written per-parameter optimizer on a model of many small tensors: a launch-bound optimizer "
                "step on both ranks alike; no sync, no straggler. The CPU cannot show it.",
    },
    "land_cover": {
        "verdict": "healthy", "rank": None, "phase": None,
        "where": {0: "trains: ResNet forward/backward on device-resident patches, one gradient all-reduce per step "
                     "overlapped with the backward",
                  1: "the same"},
        "names": [],
        "fix": None,
        "expected_gain": "none (1.00x): compute-bound (~1.2 TFLOP of convolutions per rank per step, ~35 ms on an "
                         "H100), ~94 MB fp32 all-reduce (~1 ms over NVLink) overlapped, data on the device, balanced "
                         "ranks",
        "measured_cpu": "as-is 195.9 samples/s, --fixed (the same job) 239.2 samples/s, one 25 s pair: 1.22x, the noise "
                        "of this loaded 2-core machine (an earlier pair, with a larger learning rate, went the other "
                        "way: 168.0 vs 131.9)",
        "note": "Plain DDP image classification done right: data on the device, batched augmentation, balanced "
                "ranks. No warning is right.",
    },
}

import argparse
import json
import math
import os
import random
import subprocess
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
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

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


# --------------------------------------------------------------------------- clinical_ner

NER_TAGS = ["O", "B-PROBLEM", "I-PROBLEM", "B-TEST", "I-TEST", "B-TREATMENT", "I-TREATMENT", "B-DRUG", "I-DRUG"]

# The shared task's official scorer, vendored as the organisers ship it (run as a script, as they ask).
NER_SCORER = r'''
"""Official scorer: entity-level precision / recall / F1 for BIO-tagged files (one sentence per line:
id<TAB>space-separated tags). Prints every mismatched entity, then the scores as one JSON line."""
import json
import sys


def entities(tags):
    found, start, kind = set(), None, None
    for i, tag in enumerate(tags + ["O"]):
        if start is not None and not (tag.startswith("I-") and tag[2:] == kind):
            found.add((kind, start, i - 1))
            start, kind = None, None
        if tag.startswith("B-") or (tag.startswith("I-") and start is None):
            start, kind = i, tag[2:]
    return found


def read(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("\t", 1) for line in f if line.strip())


def main():
    gold, pred = read(sys.argv[1]), read(sys.argv[2])
    tp = fp = fn = 0
    for sid, tags in gold.items():
        g = entities(tags.split())
        p = entities(pred.get(sid, "").split())
        for kind, a, b in sorted(g - p):
            print(f"MISSED   {sid} {kind:<9} tokens {a}-{b}")
        for kind, a, b in sorted(p - g):
            print(f"SPURIOUS {sid} {kind:<9} tokens {a}-{b}")
        tp, fp, fn = tp + len(g & p), fp + len(p - g), fn + len(g - p)
    precision = tp / max(1, tp + fp)
    recall = tp / max(1, tp + fn)
    f1 = 2 * precision * recall / max(1e-9, precision + recall)
    print(json.dumps({"precision": precision, "recall": recall, "f1": f1, "gold": tp + fn, "pred": tp + fp}))


if __name__ == "__main__":
    main()
'''


class NoteTagger(nn.Module):
    """A BERT-style encoder with a token-classification head (BIO tags)."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, ctx: int, tags: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width, padding_idx=0)
        self.positions = nn.Embedding(ctx, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, tags)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.norm(self.encoder(x)))


def annotated_notes(n: int, ctx: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sentences of de-identified clinical notes (token ids) with their BIO entity tags."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (n, ctx), generator=g)
    start = torch.rand(n, ctx, generator=g) < 0.14
    kind = torch.randint(0, 4, (n, ctx), generator=g)
    length = torch.randint(1, 4, (n, ctx), generator=g)
    tags = torch.zeros(n, ctx, dtype=torch.long)
    left, cur = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    for j in range(ctx):  # B- where an entity starts, I- for the rest of its span
        inside = left > 0
        new = start[:, j] & ~inside
        tags[:, j] = torch.where(new, 1 + 2 * kind[:, j], torch.where(inside, 2 + 2 * cur, 0))
        cur = torch.where(new, kind[:, j], cur)
        left = torch.where(new, length[:, j] - 1, (left - 1).clamp(min=0))
    return ids, tags


def write_tags(path: str, tags: torch.Tensor) -> None:
    with open(path, "w") as f:
        f.writelines(f"dev-{i:05d}\t{' '.join(NER_TAGS[t] for t in row)}\n" for i, row in enumerate(tags.tolist()))


def official_f1(scorer: str, gold: str, pred: str, fixed: bool) -> dict:
    """Run the organisers' scorer on the dev predictions; its last line is the JSON summary."""
    cmd = [sys.executable, scorer, gold, pred]
    if fixed:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        out, code = done.stdout, done.returncode
    else:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        code = proc.wait()
        out = proc.stdout.read()
    if code != 0:
        raise RuntimeError(f"scorer failed with exit status {code}")
    return json.loads(out.strip().splitlines()[-1])


def job_clinical_ner(t: Trainer) -> None:
    if t.small:
        cfg = {"vocab": 4000, "ctx": 64, "width": 64, "layers": 2, "heads": 4, "batch": 8, "n": 4096, "dev": 512,
               "score_every": 40}
    else:
        cfg = {"vocab": 28996, "ctx": 128, "width": 768, "layers": 12, "heads": 12, "batch": 64, "n": 65536,
               "dev": 2000, "score_every": 100}
    ids, tags = annotated_notes(cfg["n"], cfg["ctx"], cfg["vocab"], seed=21 + t.rank)  # the rank's share of notes
    model = t.wrap(NoteTagger(cfg["vocab"], cfg["width"], cfg["layers"], cfg["heads"], cfg["ctx"], len(NER_TAGS)))
    opt = adamw(t, model.parameters(), lr=5e-5 if not t.small else 5e-4, weight_decay=0.01)
    sched = warmup_cosine(opt, 100, 20_000)
    if t.rank == 0:  # rank 0 scores the dev set with the official script
        workdir = tempfile.mkdtemp(prefix="ner_dev_")
        scorer = os.path.join(workdir, "score.py")
        with open(scorer, "w") as f:
            f.write(NER_SCORER)
        dev_ids, dev_tags = annotated_notes(cfg["dev"], cfg["ctx"], cfg["vocab"], seed=5)
        gold_path, pred_path = os.path.join(workdir, "dev.gold.tsv"), os.path.join(workdir, "dev.pred.tsv")
        write_tags(gold_path, dev_tags)
        log(f"clinical NER tagger {count_params(model):.1f}M parameters, {cfg['batch']} sentences per rank, "
            f"dev F1 (official scorer) every {cfg['score_every']} steps")
    model.train()
    step = 0
    while True:
        for s in torch.randperm(cfg["n"] // cfg["batch"]).tolist():
            x = ids[s * cfg["batch"]:(s + 1) * cfg["batch"]].to(t.dev, non_blocking=True)
            y = tags[s * cfg["batch"]:(s + 1) * cfg["batch"]].to(t.dev, non_blocking=True)
            with t.autocast():
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, len(NER_TAGS)), y.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if t.rank == 0 and step % cfg["score_every"] == 0:
                model.eval()
                with torch.no_grad(), t.autocast():
                    pred = torch.cat([model.module(dev_ids[i:i + 256].to(t.dev)).argmax(-1).cpu()
                                      for i in range(0, cfg["dev"], 256)])
                model.train()
                write_tags(pred_path, pred)
                scores = official_f1(scorer, gold_path, pred_path, t.fixed)
                log(f"step {step}: loss {loss.item():.4f} dev P {scores['precision']:.3f} R {scores['recall']:.3f} "
                    f"F1 {scores['f1']:.3f}")


# --------------------------------------------------------------------------- call_intents

INTENTS = ["billing_dispute", "cancel", "upgrade", "downgrade", "outage", "slow_internet", "password_reset",
           "move_address", "payment_plan", "roaming", "sim_swap", "device_repair", "refund", "new_line",
           "port_in", "port_out", "contract_end", "complaint", "technician_visit", "parental_controls",
           "data_usage", "invoice_copy", "autopay", "other"]


def syllables() -> list[str]:
    return [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def call_center_export(n: int, seed: int) -> list[str]:
    """The transcription vendor's export: one JSON object per call (turns of agent and caller), as lines."""
    rng = random.Random(seed)
    syl = syllables()
    words = ["".join(rng.choice(syl) for _ in range(rng.randrange(1, 5))) for _ in range(6000)]
    lines = []
    for i in range(n):
        turns = []
        for k in range(rng.randrange(12, 25)):
            text = " ".join(rng.choice(words) for _ in range(rng.randrange(6, 22)))
            turns.append({"speaker": "agent" if k % 2 == 0 else "caller", "text": text.capitalize() + "."})
        lines.append(json.dumps({"call_id": f"C{seed:02d}-{i:07d}", "queue": rng.choice(["billing", "tech", "sales"]),
                                 "turns": turns, "intent": rng.choice(INTENTS)}))
    return lines


class WordPiece:
    """Greedy longest-match-first WordPiece over a fixed vocabulary, as BERT's basic tokenizer does it."""

    def __init__(self, seed: int = 1) -> None:
        rng = random.Random(seed)
        syl = syllables()
        pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[AGENT]", "[CALLER]"] + syl + ["##" + s for s in syl]
        pieces += ["".join(rng.choice(syl) for _ in range(2)) for _ in range(3000)]
        self.vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
        self.strip = str.maketrans("", "", ".,?!")

    def word(self, w: str) -> list[int]:
        out, start = [], 0
        while start < len(w):
            end, piece = len(w), None
            while start < end:
                sub = w[start:end] if start == 0 else "##" + w[start:end]
                if sub in self.vocab:
                    piece = self.vocab[sub]
                    break
                end -= 1
            if piece is None:
                return [self.vocab["[UNK]"]]
            out.append(piece)
            start = end
        return out

    def call(self, record: dict, ctx: int) -> list[int]:
        ids = [self.vocab["[CLS]"]]
        for turn in record["turns"]:
            ids.append(self.vocab["[AGENT]" if turn["speaker"] == "agent" else "[CALLER]"])
            for w in turn["text"].lower().translate(self.strip).split():
                ids.extend(self.word(w))
        return ids[:ctx - 1] + [self.vocab["[SEP]"]]


def encode_call(tok: WordPiece, line: str, ctx: int) -> tuple[list[int], int]:
    record = json.loads(line)
    return tok.call(record, ctx), INTENTS.index(record["intent"])


def pad_calls(batch: list[tuple[list[int], int]], ctx: int) -> torch.Tensor:
    """One (B, ctx + 1) tensor: the padded token ids, then the intent label in the last column."""
    out = torch.zeros(len(batch), ctx + 1, dtype=torch.long)
    for row, (ids, label) in enumerate(batch):
        out[row, :len(ids)] = torch.tensor(ids)
        out[row, -1] = label
    return out


class CallShard(IterableDataset):
    """This rank's (and this loader worker's) share of the export's lines, encoded, for ever."""

    def __init__(self, lines: list[str], ctx: int, rank: int, world: int) -> None:
        self.lines, self.ctx, self.rank, self.world = lines, ctx, rank, world

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        tok = WordPiece()
        parts, part = self.world * workers, self.rank * workers + worker
        while True:
            for line in self.lines[part::parts]:
                yield encode_call(tok, line, self.ctx)


class IntentClassifier(nn.Module):
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


def job_call_intents(t: Trainer) -> None:
    if t.small:
        cfg = {"lines": 1000, "ctx": 48, "width": 32, "layers": 1, "heads": 2, "batch": 32, "workers": 0}
    else:
        cfg = {"lines": 8000, "ctx": 256, "width": 768, "layers": 6, "heads": 12, "batch": 64, "workers": 6}
    t0 = time.time()
    lines = call_center_export(cfg["lines"], seed=4)  # one export file; every rank can read it
    tok = WordPiece()
    model = t.wrap(IntentClassifier(len(tok.vocab), cfg["width"], cfg["layers"], cfg["heads"], cfg["ctx"],
                                    len(INTENTS)))
    opt = adamw(t, model.parameters(), lr=3e-4, weight_decay=0.01)
    sched = warmup_cosine(opt, 100, 20_000)
    if t.rank == 0:
        log(f"call intent classifier {count_params(model):.1f}M parameters, {len(lines)} calls (read in "
            f"{time.time() - t0:.1f} s), batch {cfg['batch']} per rank, "
            f"{'each rank reads its own shard' if t.fixed else 'rank 0 reads the export and scatters the batches'}")
    if t.fixed:
        loader = DataLoader(CallShard(lines, cfg["ctx"], t.rank, t.world), batch_size=cfg["batch"],
                            collate_fn=lambda b: pad_calls(b, cfg["ctx"]), num_workers=cfg["workers"],
                            pin_memory=t.cuda, persistent_workers=cfg["workers"] > 0,
                            prefetch_factor=4 if cfg["workers"] else None)
        batches = iter(loader)
    else:
        def export_reader():
            while True:
                yield from lines

        reader = export_reader()  # one cursor over the export, on rank 0
    model.train()
    step = 0
    while True:
        if t.fixed:
            batch = next(batches).to(t.dev, non_blocking=True)
        else:
            batch = torch.empty(cfg["batch"], cfg["ctx"] + 1, dtype=torch.long, device=t.dev)
            if t.rank == 0:  # read the next world x batch calls and deal them out to the ranks
                chunks = [pad_calls([encode_call(tok, next(reader), cfg["ctx"]) for _ in range(cfg["batch"])],
                                    cfg["ctx"]).to(t.dev) for _ in range(t.world)]
                dist.scatter(batch, chunks, src=0)
            else:
                dist.scatter(batch, None, src=0)
        ids, label = batch[:, :-1], batch[:, -1]
        with t.autocast():
            logits = model(ids)
        loss = F.cross_entropy(logits.float(), label)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        t.trained(cfg["batch"] * t.world)
        if step % 50 == 0 and t.rank == 0:
            log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- chess_lm


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): sign of an interpolated momentum.

    The per-parameter loop is the paper's reference code; ``foreach=True`` does the same update with one
    multi-tensor call per operation over all the parameters."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0,
                 foreach: bool = False) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})
        self.foreach = foreach

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if len(self.state[p]) == 0:
                    self.state[p]["exp_avg"] = torch.zeros_like(p)
            if self.foreach:
                grads = [p.grad for p in params]
                exp_avgs = [self.state[p]["exp_avg"] for p in params]
                torch._foreach_mul_(params, 1 - lr * wd)
                update = torch._foreach_mul(exp_avgs, beta1)
                torch._foreach_add_(update, grads, alpha=1 - beta1)
                torch._foreach_sign_(update)
                torch._foreach_add_(params, update, alpha=-lr)
                torch._foreach_mul_(exp_avgs, beta2)
                torch._foreach_add_(exp_avgs, grads, alpha=1 - beta2)
                continue
            for p in params:
                grad, exp_avg = p.grad, self.state[p]["exp_avg"]
                p.data.mul_(1 - lr * wd)
                update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


class MoveBlock(nn.Module):
    """A pre-LN decoder block (separate q/k/v projections with biases, as in the GPT-NeoX-style code it came from)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        h = self.ln1(x)
        q, k, v = (proj(h).view(B, T, self.heads, C // self.heads).transpose(1, 2) for proj in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class ChessGPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList(MoveBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def job_chess_lm(t: Trainer) -> None:
    if t.small:
        cfg = {"vocab": 1968, "ctx": 32, "width": 32, "layers": 32, "heads": 4, "batch": 4}
    else:
        cfg = {"vocab": 1968, "ctx": 512, "width": 512, "layers": 32, "heads": 8, "batch": 16}
    model = t.wrap(ChessGPT(cfg["vocab"], cfg["ctx"], cfg["width"], cfg["layers"], cfg["heads"]))
    opt = Lion(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, foreach=t.fixed)
    sched = warmup_cosine(opt, 200, 100_000)
    g = torch.Generator().manual_seed(70 + t.rank)  # the rank's shard of games (UCI move tokens, packed)
    games = torch.randint(0, cfg["vocab"], (cfg["batch"] * 64, cfg["ctx"] + 1), generator=g)
    if t.rank == 0:
        n_tensors = sum(1 for _ in model.parameters())
        log(f"chess move LM {count_params(model):.1f}M parameters in {n_tensors} tensors, {cfg['batch']} x "
            f"{cfg['ctx']} moves per rank, Lion ({'foreach' if t.fixed else 'per-parameter loop'})")
    model.train()
    step = 0
    while True:
        for s in torch.randperm(len(games) // cfg["batch"], generator=g).tolist():
            chunk = games[s * cfg["batch"]:(s + 1) * cfg["batch"]].to(t.dev, non_blocking=True)
            with t.autocast():
                logits = model(chunk[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), chunk[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 100 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


# --------------------------------------------------------------------------- land_cover


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Identity() if stride == 1 and cin == cout else
                     nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x), inplace=True)


class LandCoverResNet(nn.Module):
    """ResNet-50 layout for 4-band (RGB + near infrared) satellite patches."""

    def __init__(self, bands: int, width: int, depths: list[int], classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(bands, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        stages, cin = [], width
        for i, depth in enumerate(depths):
            w = width * 2 ** i
            for j in range(depth):
                stages.append(Bottleneck(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = 4 * w
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


def job_land_cover(t: Trainer) -> None:
    if t.small:
        cfg = {"n": 2048, "size": 40, "crop": 32, "width": 16, "depths": [1, 1, 1, 1], "batch": 16}
    else:
        cfg = {"n": 8192, "size": 176, "crop": 160, "width": 64, "depths": [3, 4, 6, 3], "batch": 192}
    classes, bands = 10, 4
    g = torch.Generator(device=t.dev).manual_seed(40 + t.rank)  # the rank's tiles of the mosaic, on the device
    patches = torch.randint(0, 256, (cfg["n"], bands, cfg["size"], cfg["size"]), generator=g, device=t.dev,
                            dtype=torch.uint8)
    labels = torch.randint(0, classes, (cfg["n"],), generator=g, device=t.dev)
    mean = torch.tensor([88.0, 97.0, 79.0, 140.0], device=t.dev).view(1, bands, 1, 1)
    std = torch.tensor([40.0, 36.0, 38.0, 52.0], device=t.dev).view(1, bands, 1, 1)
    model = LandCoverResNet(bands, cfg["width"], cfg["depths"], classes).to(memory_format=torch.channels_last)
    model = t.wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * cfg["batch"] * t.world / 256, momentum=0.9, nesterov=True,
                          weight_decay=5e-5)
    rng = random.Random(40 + t.rank)
    sched = warmup_cosine(opt, 200, 50_000)
    if t.rank == 0:
        log(f"land-cover ResNet {count_params(model):.1f}M parameters, {cfg['batch']} patches of {cfg['crop']} px "
            f"per rank, data on the device")
    model.train()
    step = 0
    c = cfg["crop"]
    while True:
        order = torch.randperm(cfg["n"], device=t.dev, generator=g)
        for s in range(0, cfg["n"] - cfg["batch"] + 1, cfg["batch"]):
            idx = order[s:s + cfg["batch"]]
            y0, x0 = rng.randrange(cfg["size"] - c + 1), rng.randrange(cfg["size"] - c + 1)
            x = patches[idx, :, y0:y0 + c, x0:x0 + c].float()
            flip = torch.rand(len(idx), 1, 1, 1, device=t.dev, generator=g) < 0.5
            x = torch.where(flip, x.flip(3), x)
            x = ((x - mean) / std).contiguous(memory_format=torch.channels_last)
            with t.autocast():
                logits = model(x)
            loss = F.cross_entropy(logits.float(), labels[idx], label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            t.trained(cfg["batch"] * t.world)
            if step % 50 == 0 and t.rank == 0:
                log(f"step {step}: loss {loss.item():.4f}")


JOBS = {"clinical_ner": job_clinical_ner, "call_intents": job_call_intents, "chess_lm": job_chess_lm,
        "land_cover": job_land_cover}


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
