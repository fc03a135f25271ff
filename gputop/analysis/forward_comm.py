"""Collectives inside the model's forward: tensor (model) parallelism, as the ranks' stacks show
it. Pure: stack samples in.

Data parallelism all-reduces gradients once a step, from the backward (DDP's reducer, FSDP's
reduce-scatter), overlapped with it; its forward has no collective (DDP's buffer broadcast and
FSDP's parameter all-gathers run in their own wrappers' code, left out here). Tensor parallelism
splits each layer's matmuls over the ranks and all-reduces (or gathers) the activations between
them, inside the forward, twice a layer in Megatron's layout: a hand-written
``ColumnParallelLinear``/``RowParallelLinear`` pair, Megatron-LM's ``tensor_parallel`` mappings,
torch's ``parallelize_module`` (DTensor redistributes). Those collectives sit on the critical path:
the next matmul needs their result. A held-out 336M-parameter LM split this way over two H200s
(each GPU 15 % full) ran 1.36x faster as plain DDP; its main threads were seen in ``all_reduce``
under ``_ReduceFromTP.forward`` under the model's forward on both ranks, its NVLinks carrying
~104 GB/s (a DDP job beside it: ~6 GB/s).

Left out, as not tensor parallelism: SyncBatchNorm's statistics gather, DDP's and FSDP's own
collectives (their wrappers' frames), DeepSpeed ZeRO-3's parameter gathers, and all_to_all
(a mixture of experts' token exchange is a different trade).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..model import Frame, StackSample
from .classify import is_library, short_path

_COLLECTIVES = frozenset({"all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce_scatter",
                          "reduce_scatter_tensor", "_reduce_scatter_base", "all_gather_tensor",
                          "reduce_scatter_tensor_coalesced", "all_reduce_coalesced"})
_COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/_functional_collectives.py")
_REDISTRIBUTE = "torch/distributed/tensor/_redistribute.py"  # DTensor (parallelize_module)
_MODULE_CALL = ("Module._call_impl", "torch/nn/modules/module.py")
# Whose collectives in a forward are data parallelism's or a norm's, not tensor parallelism's.
_NOT_TP = ("torch/nn/parallel/distributed.py", "torch/distributed/fsdp/", "torch/distributed/_composable/",
           "torch/nn/modules/batchnorm.py", "torch/nn/modules/_functions.py", "deepspeed/runtime/zero/",
           "torch/nn/parallel/data_parallel.py")


def _path(f: Frame) -> str:
    return f.filename.replace("\\", "/")


def _collective_at(frames: Sequence[Frame]) -> int | None:
    for i, f in enumerate(frames):
        p = _path(f)
        if (f.name in _COLLECTIVES and p.endswith(_COLLECTIVE_FILES)) or p.endswith(_REDISTRIBUTE):
            return i
    return None


def in_forward_collective(frames: Sequence[Frame]) -> Frame | None:
    """The user's frame nearest a collective called inside a module's forward, or a library frame
    where the user has none (torch's own tensor parallel styles); None when the sample is not in
    such a collective."""
    at = _collective_at(frames)
    if at is None:
        return None
    outer = frames[at + 1:]
    if not any(f.name == _MODULE_CALL[0] and _path(f).endswith(_MODULE_CALL[1]) for f in outer):
        return None
    if any(n in _path(f) for f in outer for n in _NOT_TP):
        return None
    return next((f for f in outer if not is_library(f.filename)), frames[at])


@dataclass(frozen=True)
class RankForwardComm:
    pid: int
    rank: int | None
    samples: int  # main-thread samples
    in_forward: int  # of them in a collective inside the forward


@dataclass(frozen=True)
class ForwardComm:
    procs: tuple[RankForwardComm, ...] = ()
    where: str | None = None  # the commonest place: "_ReduceFromTP.forward (model.py:546)"
    collective: str | None = None  # "all_reduce"

    @property
    def seen(self) -> int:
        return sum(p.in_forward for p in self.procs)

    @property
    def ranks_seen(self) -> int:
        return sum(1 for p in self.procs if p.in_forward)


def forward_comm_of(stacks: Sequence[StackSample], pids: Sequence[int], t0: float,
                    pid_rank: Mapping[int, int] | None = None) -> ForwardComm:
    """Collectives inside the forward in ``pids``' main-thread samples since ``t0``."""
    want = set(pids)
    pid_rank = pid_rank or {}
    n: Counter = Counter()
    k: Counter = Counter()
    where: Counter = Counter()
    names: Counter = Counter()
    # Samples of one stack share its frames (the store keeps each stack once): judged once per
    # call, by the frames' identity: (the place, the collective's name) or None.
    judged: dict[int, tuple[str, str] | None] = {}
    for s in stacks:
        if not s.is_main or s.pid not in want or s.ts < t0:
            continue
        n[s.pid] += 1
        key = id(s.frames)
        if key not in judged:
            f = in_forward_collective(s.frames)
            at = _collective_at(s.frames) if f is not None else None
            judged[key] = None if f is None or at is None else (
                f"{f.name} ({short_path(f.filename)}:{f.line})", s.frames[at].name)
        seen = judged[key]
        if seen is None:
            continue
        k[s.pid] += 1
        where[seen[0]] += 1
        names[seen[1]] += 1
    procs = tuple(RankForwardComm(p, pid_rank.get(p), n[p], k[p])
                  for p in sorted(want, key=lambda p: (pid_rank.get(p, 0), p)) if n[p])
    return ForwardComm(procs, where.most_common(1)[0][0] if where else None,
                       names.most_common(1)[0][0] if names else None)
