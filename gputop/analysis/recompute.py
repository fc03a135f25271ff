"""Activation checkpointing as the stacks show it: the forward recomputed inside backward. Pure:
stack samples in.

A checkpointed block keeps only its inputs in forward; in backward, when autograd first needs
one of the block's saved tensors, its forward runs again. Where that recomputation runs:

- ``torch.utils.checkpoint`` without reentry (``use_reentrant=False``, the default of recent
  torch; Hugging Face's ``gradient_checkpointing_enable()``, ``checkpoint_wrapper`` with
  ``CheckpointImpl.NO_REENTRANT``, ``torch.distributed._composable.checkpoint``): autograd's
  unpack hook, ``_checkpoint_hook.__init__.<locals>.unpack_hook``, calls
  ``_checkpoint_without_reentrant_generator.<locals>.recompute_fn`` (torch 2.0-2.3:
  ``_checkpoint_without_reentrant.<locals>.recompute_fn``; torch 1.13:
  ``_checkpoint_without_reentrant.<locals>.unpack``), all in torch/utils/checkpoint.py;
- with reentry (``use_reentrant=True``, ``checkpoint_wrapper``'s default ``REENTRANT``):
  ``CheckpointFunction.backward`` in torch/utils/checkpoint.py;
- DeepSpeed's own (deepspeed/runtime/activation_checkpointing/checkpointing.py):
  ``CheckpointFunction.backward``, or ``non_reentrant_checkpoint.<locals>.checkpoint_unpack``;
  Megatron-LM's (megatron/core/tensor_parallel/random.py): ``CheckpointFunction.backward``.

On a GPU autograd runs backward on its own thread per device, not on the thread that called
``loss.backward()``: the main thread waits in ``_engine_run_backward`` while the recomputation
shows on that unnamed thread (seen on 2 x H200, FSDP2 and a Hugging Face Qwen2: the main thread
off the CPU in backward, the recomputed ``Qwen2Attention.forward`` under ``recompute_fn`` on the
other thread). On the CPU it runs on the calling thread itself. So each instant the main thread
was sampled is judged by every thread of its process sampled in the same py-spy dump (one
timestamp per dump): an instant some thread of it recomputed is an instant of the step spent
recomputing. The share is of the host's time: what the recomputation costs the step when the
host paces the GPU (a step with syncs, FSDP's all-gathers), as the other stack shares are.

Where the forward enters checkpointing says which switch turned it on (the fix's wording):
Hugging Face's ``GradientCheckpointingLayer`` (or a model's ``_gradient_checkpointing_func``)
under transformers/, ``CheckpointWrapper.forward`` (torch/distributed/algorithms/_checkpoint/
checkpoint_wrapper.py: ``apply_activation_checkpointing``, Lightning's and accelerate's FSDP
``activation_checkpointing``), the composable ``checkpoint(module)``'s forward hook, DeepSpeed,
Megatron, or the user's own call of ``torch.utils.checkpoint.checkpoint`` (named by its line).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..model import Frame, StackSample
from .classify import is_library, short_path

# Which API wraps the checkpointed blocks, as the forward's stack shows it.
CKPT_HF = "transformers"  # model.gradient_checkpointing_enable() (Trainer's gradient_checkpointing=True)
CKPT_WRAPPER = "checkpoint_wrapper"  # torch.distributed's checkpoint_wrapper / apply_activation_checkpointing
CKPT_COMPOSABLE = "composable"  # torch.distributed._composable.checkpoint(module)
CKPT_DEEPSPEED = "deepspeed"
CKPT_MEGATRON = "megatron"
CKPT_PLAIN = "torch.utils.checkpoint"  # the user's own checkpoint(block, x)

_TORCH_CKPT = "torch/utils/checkpoint.py"
_DS_CKPT = "deepspeed/runtime/activation_checkpointing/checkpointing.py"
_MEGATRON_CKPT = "megatron/core/tensor_parallel/random.py"
_WRAPPER_FILE = "torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py"
_COMPOSABLE_FILE = "torch/distributed/_composable/checkpoint_activation.py"

# (file, function): frames that run only while backward recomputes a checkpointed forward.
_RECOMPUTE: tuple[tuple[str, re.Pattern], ...] = (
    (_TORCH_CKPT, re.compile(r"CheckpointFunction\.backward|.*\.<locals>\.(recompute_fn|unpack_hook"
                             r"|unpack_hook_with_error_cb|unpack|inner_unpack)")),
    (_DS_CKPT, re.compile(r"CheckpointFunction\.backward|.*\.<locals>\.checkpoint_unpack")),
    (_MEGATRON_CKPT, re.compile(r"CheckpointFunction\.backward")),
)
# (file, function): frames of a checkpointed block's first forward (its entry into checkpointing).
_ENTRY: tuple[tuple[str, re.Pattern], ...] = (
    (_TORCH_CKPT, re.compile(r"checkpoint|checkpoint_sequential|CheckpointFunction\.forward")),
    (_WRAPPER_FILE, re.compile(r"CheckpointWrapper\.forward")),
    (_COMPOSABLE_FILE, re.compile(r"checkpoint\.<locals>\.forward_pre_hook")),
    (_DS_CKPT, re.compile(r"checkpoint|non_reentrant_checkpoint|CheckpointFunction\.forward")),
    (_MEGATRON_CKPT, re.compile(r"checkpoint|CheckpointFunction\.forward")),
)

_FILES = tuple({file for file, _ in _RECOMPUTE + _ENTRY})


def _path(f: Frame) -> str:
    return f.filename.replace("\\", "/")


@functools.lru_cache(maxsize=8192)
def _kind(name: str, filename: str) -> int:
    """0: neither; 1: a recomputation frame; 2: a checkpointed first forward's entry frame. Kept
    per (function, file): a window holds thousands of samples of a few hundred distinct frames,
    judged every tick."""
    path = filename.replace("\\", "/")
    if not path.endswith(_FILES):
        return 0
    if any(path.endswith(file) and pat.fullmatch(name) for file, pat in _RECOMPUTE):
        return 1
    if any(path.endswith(file) and pat.fullmatch(name) for file, pat in _ENTRY):
        return 2
    return 0


_library = functools.lru_cache(maxsize=8192)(is_library)


def recomputing(frames: Sequence[Frame]) -> bool:
    """The thread runs a checkpointed block's forward again, inside backward."""
    return any(_kind(f.name, f.filename) == 1 for f in frames)


def checkpoint_entry(frames: Sequence[Frame]) -> tuple[str, str | None] | None:
    """Where a first forward enters checkpointing: (the API, the user's frame that calls it,
    "Block.forward (model.py:88)", or None), or None when the stack is not in a checkpointed
    block's forward (or is recomputing one: that is backward's)."""
    return _judge(frames)[1]


def _judge(frames: Sequence[Frame]) -> tuple[bool, tuple[str, str | None] | None]:
    """(recomputing, checkpoint_entry) of one stack, its frames looked at once."""
    kinds = [_kind(f.name, f.filename) for f in frames]
    if 1 in kinds:
        return True, None
    if 2 not in kinds:
        return False, None
    # frames are newest first: the oldest entry frame is where checkpointing was entered
    first = len(kinds) - 1 - kinds[::-1].index(2)
    files = {_path(f) for f, k in zip(frames, kinds) if k == 2}
    older = frames[first + 1:]
    if any(p.endswith(_DS_CKPT) for p in files):
        api = CKPT_DEEPSPEED
    elif any(p.endswith(_MEGATRON_CKPT) for p in files):
        api = CKPT_MEGATRON
    elif any(p.endswith(_WRAPPER_FILE) for p in files):
        api = CKPT_WRAPPER
    elif any(p.endswith(_COMPOSABLE_FILE) for p in files):
        api = CKPT_COMPOSABLE
    else:
        # The first frame past torch's own wrappers (dynamo's disable, _compile) says who called it.
        caller = next((f for f in older if not short_path(f.filename).startswith("torch/")), None)
        api = CKPT_HF if caller is not None and short_path(caller.filename).startswith("transformers/") else CKPT_PLAIN
    user = next((f for f in older if not _library(f.filename)), None)
    return False, (api, f"{user.name} ({short_path(user.filename)}:{user.line})" if user is not None else None)


@dataclass(frozen=True)
class ProcRecompute:
    """One process (a rank, or the job's one process) over the window."""

    pid: int
    rank: int | None
    samples: int  # instants its main thread was sampled
    recompute: int  # of them, instants some thread of it recomputed a checkpointed forward
    entered: int  # of them, instants its main thread was in a checkpointed block's first forward

    @property
    def share(self) -> float:
        return self.recompute / self.samples if self.samples else 0.0


@dataclass(frozen=True)
class Recompute:
    """Activation checkpointing across the job's processes."""

    procs: tuple[ProcRecompute, ...] = ()
    api: str | None = None  # one of the CKPT_ names; None: no checkpointed first forward seen
    caller: str | None = None  # the user's frame over the checkpointed forward, most often

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.procs)

    @property
    def recompute(self) -> int:
        return sum(p.recompute for p in self.procs)

    @property
    def share(self) -> float:
        """The pooled share of the processes' sampled instants spent recomputing: the ranks of a
        job run the same step, so their samples are one sample of it."""
        n = self.samples
        return self.recompute / n if n else 0.0

    @property
    def seen(self) -> bool:
        """Checkpointing is on: a block's forward was seen recomputed, or entering checkpointing."""
        return any(p.recompute or p.entered for p in self.procs)


def recompute_of(stacks: Sequence[StackSample], pids: Sequence[int], t0: float,
                 pid_rank: Mapping[int, int] | None = None) -> Recompute:
    """Checkpointing in ``pids``' samples since ``t0`` (every thread's: on a GPU the recomputation
    runs on autograd's own thread)."""
    want = set(pids)
    pid_rank = pid_rank or {}
    main_ts: dict[int, set[float]] = {p: set() for p in want}
    busy: dict[int, set[float]] = {p: set() for p in want}
    entered: Counter = Counter()
    apis: Counter = Counter()
    callers: Counter = Counter()
    # Samples of one stack share its frames (the store keeps each stack once): judged once per
    # call, by the frames' identity (alive for the whole call, so no id is reused).
    judged: dict[int, tuple[bool, tuple[str, str | None] | None]] = {}
    for s in stacks:
        if s.pid not in want or s.ts < t0:
            continue
        key = id(s.frames)
        if key not in judged:
            judged[key] = _judge(s.frames)
        again, entry = judged[key]
        if again:
            busy[s.pid].add(s.ts)
        if s.is_main:
            main_ts[s.pid].add(s.ts)
            if entry is not None:
                entered[s.pid] += 1
                apis[entry[0]] += 1
                if entry[1]:
                    callers[entry[1]] += 1
    procs = tuple(
        ProcRecompute(pid, pid_rank.get(pid), len(main_ts[pid]), len(busy[pid] & main_ts[pid]), entered[pid])
        for pid in sorted(want, key=lambda p: (pid_rank.get(p, 0), p)) if main_ts[pid]
    )
    return Recompute(procs, apis.most_common(1)[0][0] if apis else None,
                     callers.most_common(1)[0][0] if callers else None)


__all__ = ["CKPT_COMPOSABLE", "CKPT_DEEPSPEED", "CKPT_HF", "CKPT_MEGATRON", "CKPT_PLAIN", "CKPT_WRAPPER",
           "ProcRecompute", "Recompute", "checkpoint_entry", "recompute_of", "recomputing"]
