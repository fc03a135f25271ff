"""What a thread is doing, from its Python stack: a table of rules over frames.

Pure: frames in, a ``Category`` out. Extending it means adding a ``Rule`` to ``RULES``.

How a stack is judged:
- Each frame takes the first rule in ``RULES`` that matches it (path, function, and for the
  innermost frame only, the text of its source line).
- Among the frames that matched, the category earliest in ``PRIORITY`` wins; on a tie the
  innermost frame wins. Priority encodes context: a ``torch.load`` inside a dataset's
  ``__getitem__`` is data loading, not a checkpoint; a ``.item()`` inside ``forward`` is a host
  sync; forward recomputed inside ``backward`` (activation checkpointing) is backward.
- No match: idle when py-spy saw the thread blocked (sleep, lock, queue), otherwise other.
- An optimizer step that calls a closure (Lightning's automatic optimisation) is judged by what
  runs inside the closure: matched frames newer than the newest optimizer frame decide.
- Collective means a communication call (c10d's collectives, barriers, ``work.wait()``, native
  reducer/gloo/NCCL waits), not any frame under ``torch/distributed/``.
- Frames outward of ``BaseProcess._bootstrap`` are the parent's stack at fork time (a DataLoader
  worker shows its parent's ``for batch in loader`` below its own loop) and are ignored.
- A rank of a multi-rank job on the CPU is judged with its on-CPU state as well (``rank_category``):
  off the CPU in autograd's engine or in DDP's forward prologue it waits for the other ranks.
"""

from __future__ import annotations

from collections import Counter

import re
from dataclasses import dataclass, field, replace
from typing import Collection, Sequence

from ..model import Category, Frame, StackSample
from .threshold import IntThreshold, JUDGEMENT

C = Category


@dataclass(frozen=True)
class Rule:
    """One row of the table. Every condition given must hold; at least one must be given.

    ``path`` is searched in the frame's file name (``/`` separators), ``func`` must match the
    whole function name as py-spy gives it (``Class.method``), ``code`` is searched in the
    innermost frame's source line only: a C call like ``.item()`` has no frame of its own, so
    it is only visible as the line that calls it, and only where that line is the newest frame.
    """

    category: Category
    path: str | None = None
    func: str | None = None
    code: str | None = None
    why: str = ""
    framework: str = ""  # the framework the rule exists for ("" for torch and the standard library)
    _path: re.Pattern | None = field(default=None, init=False, repr=False, compare=False)
    _func: re.Pattern | None = field(default=None, init=False, repr=False, compare=False)
    _code: re.Pattern | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (self.path or self.func or self.code):
            raise ValueError("a rule needs a path, func or code pattern")
        for name, pat in (("_path", self.path), ("_func", self.func), ("_code", self.code)):
            object.__setattr__(self, name, re.compile(pat) if pat else None)

    def matches(self, frame: Frame, leaf: bool) -> bool:
        if self._code is not None and (not leaf or not frame.code or not self._code.search(frame.code)):
            return False
        if self._path is not None and not self._path.search(frame.filename.replace("\\", "/")):
            return False
        if self._func is not None and not self._func.fullmatch(frame.name):
            return False
        return True


_DATA = r"/torch/utils/data/"
_DIST = r"/torch/distributed/"
# Reading a device tensor back waits for the device. `float(t)`, `print(t)` of a tensor sync as
# `.item()` does; print and f-strings of a tensor run torch/_tensor_str.py (a frame rule below),
# `float(` has no frame of its own. `.to("cpu")` is `.cpu()` written out. `float("-inf")` (a
# literal, a mask's fill value) reads no tensor: a held-out job's CPU-built mask line was called
# a sync for it.
_SYNC_CODE = (r"\.item\(\)|\.cpu\(\)|\.tolist\(\)|\.numpy\(\)|\bfloat\((?!\s*['\"])|\.synchronize\(\)|cuda\.synchronize\("
              r"|\.to\(\s*(device\s*=\s*)?['\"]cpu['\"]")
# A wait on a communication handle (`work.wait()`, `handle.wait()`, `reqs[i].wait()`): c10d's
# Work.wait is C, so only its caller's line shows it. Told apart from a threading.Event's wait by
# the name only (that one has Python frames of its own, so it is rarely the newest frame anyway).
_WAIT_CODE = r"\b\w*(work|handle|req|request|fut|future)s?(\[[^\]]*\])?\.wait\("
# What text can and cannot know about a copy: `.to(x)` copies to the device only when x is not
# the tensor's own device, and a job that trains on the CPU (or `x` that is already on the GPU)
# copies nothing. The classifier reads text, so it takes any `.to(...)` that names something other
# than a dtype or a memory format (HF's `data.to(**kwargs)`, `x.to(DEV)`, `batch.to(self.device)`)
# as a host-to-device copy, and `.copy_(src, non_blocking=True)` too (non_blocking only means
# anything across devices); a plain `.copy_(src)` is usually CPU to CPU and is not taken. The
# PCIe receive counters are where a copy is confirmed, not here.
TO_NOT_A_COPY = (r"\s*(dtype\s*=|memory_format\s*=|(torch\.)?(float|half|bfloat16|double|int|long|short|"
                  r"uint8|int8|bool|complex|cfloat)\w*\s*[,)]|[\w.]*dtype\s*\))")
_H2D_CODE = r"\.cuda\(|\.to\((?!" + TO_NOT_A_COPY + r")|\.copy_\([^)]*non_blocking"
# torch.distributed's communication calls: what a rank waits in for the others. Everything else
# under torch/distributed/ (FSDP's and checkpoint_wrapper's module wrappers, the c10d logger's
# decorator, DDP's Python) is whatever runs inside it.
_C10D_CALLS = (r"all_reduce(_coalesced)?|all_gather(_into_tensor|_object|_coalesced)?|reduce_scatter(_tensor)?"
               r"|reduce|broadcast(_object_list)?|(monitored_)?barrier|_store_based_barrier|(i)?send|(i)?recv"
               r"|(send|recv)_object_list|batch_isend_irecv|all_to_all(_single)?|gather(_object)?"
               r"|scatter(_object_list)?|init_process_group|new_group")

# Order matters only among rules that can match the same frame: the first one wins it.
# ``framework`` names the framework a rule exists for; tests/test_classify_frameworks.py checks
# that a real capture from that framework needs the rule.
RULES: tuple[Rule, ...] = (
    # --- data loading (torch.utils.data)
    Rule(C.DATA_WAIT, _DATA + r"dataloader\.py$", r"_MultiProcessingDataLoaderIter\._(try_)?get_data",
         why="main process waiting on the worker queue"),
    Rule(C.IDLE, _DATA + r"_utils/(worker|pin_memory)\.py$", r"_worker_loop|_pin_memory_loop|do_one_step",
         why="loader worker or pin-memory thread waiting for work (deeper frames win when busy)"),
    Rule(C.DATA_FETCH, _DATA, why="dataset, sampler, fetch or collate work"),
    # --- checkpoints
    Rule(C.CHECKPOINT_IO, r"/torch/serialization\.py$", why="torch.save / torch.load"),
    Rule(C.CHECKPOINT_IO, _DIST + r"checkpoint/", why="torch.distributed.checkpoint"),
    Rule(C.CHECKPOINT_IO, r"/safetensors/", why="safetensors save/load", framework="safetensors"),
    Rule(C.CHECKPOINT_IO, func=r"(.*\.)?(_?save_checkpoint|load_checkpoint|save_pretrained|save_model)",
         why="trainer checkpoint helpers (Lightning, Hugging Face, DeepSpeed)", framework="lightning/transformers"),
    # --- optimizer
    # Making the optimizer (its __init__, adding param groups) is set-up, not a step: a job's
    # start-up showed 16 samples of "optimizer" in `torch.optim.SGD(...)` importing what it needs.
    Rule(C.OTHER, r"/torch/optim/", r"(\w+\.)?(__init__|add_param_group|_patch_step_function)",
         why="making an optimizer (set-up, not a step)"),
    Rule(C.OPTIMIZER, r"/torch/optim/", why="optimizer step, zero_grad, LR scheduler"),
    Rule(C.OPTIMIZER, r"/torch/amp/grad_scaler\.py$", r"GradScaler\.(step|update|_maybe_opt_step|unscale_)",
         why="AMP grad scaler step"),
    Rule(C.OPTIMIZER, r"/(apex|bitsandbytes|deepspeed)/.*optim", why="third-party optimizers",
         framework="apex/bitsandbytes/deepspeed"),
    # --- collectives: communication calls, not whatever lives under torch/distributed/
    Rule(C.COLLECTIVE, _DIST + r"distributed_c10d\.py$", _C10D_CALLS,
         why="torch.distributed collectives, point-to-point, barriers, rendezvous"),
    Rule(C.COLLECTIVE, _DIST + r"(_functional_collectives|fsdp/_fully_shard/_fsdp_collectives)\.py$",
         why="functional collectives and their waits, FSDP2's all-gather / reduce-scatter"),
    Rule(C.COLLECTIVE, r"/torch/nn/parallel/distributed\.py$", r".*\._(sync|\w*broadcast)\w*",
         why="DDP buffer/parameter sync", framework="ddp"),
    Rule(C.COLLECTIVE, code=_WAIT_CODE, why="work.wait() on an asynchronous collective"),
    # Native frames (py-spy --native): a DDP rank blocked in the gradient all-reduce shows only an
    # off-CPU `_engine_run_backward` in Python, and under that the reducer's wait.
    Rule(C.COLLECTIVE, func=r"c10d::(Reducer::finalize_backward|.*::wait\w*|ProcessGroup\w*::\w+)|gloo::.*|nccl\w+",
         why="c10d reducer / process-group wait, gloo or NCCL (native frames)"),
    Rule(C.COLLECTIVE, r"/(deepspeed/comm|horovod)/", why="DeepSpeed / Horovod communication",
         framework="deepspeed/horovod"),
    # --- host <-> device
    Rule(C.HOST_SYNC, r"/torch/(cuda|accelerator|xpu|mps)/__init__\.py$", r"synchronize",
         why="torch.cuda / torch.accelerator synchronize()"),
    Rule(C.HOST_SYNC, r"/torch/cuda/streams\.py$", r"(Stream|Event)\.(synchronize|wait)",
         why="stream/event wait on the host"),
    Rule(C.HOST_SYNC, r"/torch/cuda/memory\.py$", r"empty_cache", why="freeing cached memory synchronises"),
    Rule(C.HOST_SYNC, r"/torch/_tensor_str\.py$", why="print / format of a tensor reads it back"),
    Rule(C.HOST_SYNC, code=_SYNC_CODE, why=".item() / .cpu() / .tolist() / .numpy() / float() / synchronize()"),
    Rule(C.H2D_COPY, code=_H2D_CODE, why=".cuda() / .to(device) / copy_(non_blocking)"),
    Rule(C.H2D_COPY, func=r"(.*\.)?(send_to_device|move_data_to_device|_move_to_device)",
         why="Accelerate / Lightning batch transfer", framework="accelerate/lightning"),
    Rule(C.GC, code=r"\bgc\.collect\(", why="explicit gc.collect()"),
    # --- model
    Rule(C.BACKWARD, func=r"(.*\.)?backward|_engine_run_backward",
         why="Tensor.backward, autograd.backward, custom Function.backward, accelerator/manual backward"),
    Rule(C.FORWARD, r"/torch/nn/modules/module\.py$", r"Module\._(wrapped_)?call_impl(\.<locals>\.inner)?",
         why="module call"),
    Rule(C.FORWARD, func=r"(.*\.)?forward", why="a forward method"),
    # --- waiting on purpose
    Rule(C.IDLE, code=r"\b(time\.)?sleep\(", why="sleep"),
)

# Which category wins when frames of one stack disagree (earliest wins).
PRIORITY: tuple[Category, ...] = (
    C.DATA_WAIT,
    C.DATA_FETCH,
    C.CHECKPOINT_IO,
    C.OPTIMIZER,
    C.COLLECTIVE,
    C.HOST_SYNC,
    C.H2D_COPY,
    C.GC,
    C.BACKWARD,
    C.FORWARD,
    C.IDLE,
    C.OTHER,
)
_RANK = {c: i for i, c in enumerate(PRIORITY)}

# A forked process's stack continues below this frame with its parent's frames at fork time.
_FORK_BOUNDARY = re.compile(r"(BaseProcess\._bootstrap)$")


@dataclass(frozen=True)
class Match:
    category: Category
    index: int | None = None  # the deciding frame (0 = newest), None for the fallback
    rule: Rule | None = None


def own_frames(frames: Sequence[Frame]) -> Sequence[Frame]:
    """The frames that belong to this process: a forked child's inherited frames cut off."""
    for i, f in enumerate(frames):
        if _FORK_BOUNDARY.fullmatch(f.name) and f.filename.replace("\\", "/").endswith("multiprocessing/process.py"):
            return frames[: i + 1]
    return frames


# Python's import machinery: the frames newer than it run a module's top-level code.
IMPORT_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
# An import is what the thread does only when it is near the top of the stack: a training loop
# started from inside an import (a module run by importlib, runpy) has import frames at the bottom
# of every stack.
IMPORT_TOP_FRAMES = IntThreshold(
    8, "frames", JUDGEMENT,
    "An import is what a thread does only when it is this near the top of its stack: a loop started from inside an"
    " import (runpy) has import frames at the bottom of every stack.")


def importing_at(frames: Sequence[Frame]) -> int | None:
    """The index of the newest import-machinery frame when the stack is importing a module (one
    within the top ``IMPORT_TOP_FRAMES``, or one that runs a library module's top-level code
    however deep: ``import torch.distributed._functional_collectives`` registering its custom
    ops reads source files 9 frames above the import, and is an import, not a collective), else
    None. A user's module run by an import (a loop started as ``import train``) is not one."""
    top = next((i for i, f in enumerate(frames[:IMPORT_TOP_FRAMES]) if f.filename in IMPORT_FILES), None)
    if top is not None:
        return top
    for i in range(len(frames) - 1):
        if frames[i].name == "<module>" and frames[i + 1].filename in IMPORT_FILES and is_library(frames[i].filename):
            return i + 1
    return None


def explain(frames: Sequence[Frame], active: bool = True, rules: Sequence[Rule] = RULES) -> Match:
    """The category of a stack (newest frame first), with the frame and rule that decided it.
    A module being imported is no work of its own: ``import torch`` runs the top-level code of
    modules under ``torch/distributed/`` or ``torch/optim/``, which says nothing of collectives or
    an optimizer step; only the frames that called the import decide (the training step that
    imported lazily, or nothing: other)."""
    own = own_frames(frames)
    imp = importing_at(own)
    found: list[Match] = []
    for i, frame in enumerate(own):
        if imp is not None and i <= imp:
            continue
        m = next((Match(r.category, i, r) for r in rules if r.matches(frame, leaf=i == 0)), None)
        if m is not None:
            found.append(m)
    # Frames newer than the newest optimizer frame run inside the optimizer step without being
    # the optimizer's code: a closure (Lightning's automatic optimisation runs training_step and
    # backward in `optimizer.step(closure)`, LBFGS calls its closure). Where they say what they do,
    # they decide, not the optimizer frame around them. (Frame names, not the `closure()` line:
    # library frames below the newest carry no source text.)
    opt = next((m.index for m in found if m.category is C.OPTIMIZER), None)
    if opt is not None and any(m.index < opt for m in found):
        found = [m for m in found if m.index < opt]
    best = min(found, key=lambda m: _RANK[m.category], default=None)  # ties: the newest (first) wins
    if best is not None:
        return best
    return Match(C.OTHER if active else C.IDLE)


def classify(frames: Sequence[Frame], active: bool = True, rules: Sequence[Rule] = RULES) -> Category:
    return explain(frames, active, rules).category


# --------------------------------------------------------------------------- a rank's main thread

# Where a rank of a multi-rank job training on the CPU (gloo) waits for the other ranks without a
# torch.distributed frame of its own: DDP's gradient all-reduce runs inside `loss.backward()`
# (the reducer's hooks in autograd's engine, C++: the Python stack ends in the engine call), and
# its buffer and parameter broadcasts in its forward prologue (`_pre_forward`, `_sync_buffers`,
# the Reducer's calls: the stack ends in DDP's Python calling into C). On the CPU the rank's
# backward computes on its own main thread, so that thread off the CPU there is the wait.
# (On a GPU it is not: autograd's device threads run the backward while the main thread waits
# for them, and NCCL's all-reduce does not block the host; a rank on a GPU keeps its category.)
_ENGINE_WAIT = re.compile(r"/torch/autograd/(graph|__init__)\.py$")
_DDP_FILE = re.compile(r"/torch/nn/parallel/distributed\.py$")


def rank_category(frames: Sequence[Frame], active: bool, category: Category) -> Category:
    """A CPU rank's main-thread sample judged as a rank's: off the CPU (``active`` False: py-spy's
    idle flag, or /proc's state where the sampler read it) with its newest frame in autograd's
    engine call while in backward, or in DDP's own code, it waits in a collective; any other
    sample keeps ``category`` (its frames' category, ``classify``)."""
    if active or category not in (C.BACKWARD, C.FORWARD):
        return category
    own = own_frames(frames)
    if not own:
        return category
    leaf = own[0].filename.replace("\\", "/")
    if category is C.BACKWARD and _ENGINE_WAIT.search(leaf):
        return C.COLLECTIVE
    if _DDP_FILE.search(leaf):
        return C.COLLECTIVE
    return category


def rank_samples(stacks: Sequence[StackSample], cpu_ranks: Collection[int]) -> list[StackSample]:
    """``stacks`` with the main-thread samples of ``cpu_ranks`` (the PIDs of a multi-rank job's
    ranks that hold no GPU) judged as a rank's (``rank_category``); everything else as it is."""
    if not cpu_ranks:
        return list(stacks)
    out = []
    for s in stacks:
        if s.is_main and not s.active and s.pid in cpu_ranks:
            cat = rank_category(s.frames, s.active, s.category)
            if cat is not s.category:
                s = replace(s, category=cat)
        out.append(s)
    return out


# --------------------------------------------------------------------------- frame helpers

_LIB_MARKERS = ("/site-packages/", "/dist-packages/")
_STDLIB = re.compile(r"/lib(64)?/python\d+(\.\d+)?t?/")


def is_library(filename: str) -> bool:
    """True for installed packages, the standard library and frozen/builtin code.

    Everything else is taken to be the user's project: that is what the pane highlights and
    where a stuck job is reported.
    """
    f = filename.replace("\\", "/")
    if not f or f.startswith("<"):
        return True
    if any(m in f for m in _LIB_MARKERS):
        return True
    return bool(_STDLIB.search(f))


def short_path(filename: str) -> str:
    """A file name as short as still says where it is: the package path for libraries, the
    last two components for project files."""
    f = filename.replace("\\", "/")
    for m in _LIB_MARKERS:
        if m in f:
            return f.split(m, 1)[1]
    m = _STDLIB.search(f)
    if m:
        return f[m.end():]
    parts = [p for p in f.split("/") if p]
    return "/".join(parts[-2:]) if len(parts) > 2 else f


def project_frame(frames: Sequence[Frame]) -> Frame | None:
    """The newest frame in the user's own code (where to look first), or None."""
    for f in own_frames(frames):
        if not is_library(f.filename):
            return f
    return None


def stack_key(frames: Sequence[Frame]) -> tuple:
    """Identity of a stack for 'has it moved?': every frame's function, file and line."""
    return tuple((f.name, f.filename, f.line) for f in frames)


def where(frames: Sequence[Frame]) -> str:
    """'file:line in function' of the newest project frame (else the newest frame)."""
    f = project_frame(frames) or (frames[0] if frames else None)
    if f is None:
        return "no Python frames"
    return f"{short_path(f.filename)}:{f.line} in {f.name}"


def category_shares(main: Sequence[StackSample]) -> tuple[tuple[Category, float], ...]:
    """Share of samples per category, largest first (ties in the classifier's order)."""
    if not main:
        return ()
    counts = Counter(s.category for s in main)
    order = list(Category)
    n = len(main)
    return tuple(
        (c, k / n) for c, k in sorted(counts.items(), key=lambda ck: (-ck[1], order.index(ck[0])))
    )


def hot_place(samples: Sequence[StackSample]) -> tuple[str, int] | None:
    """The commonest place of the user's code among ``samples`` (by function and file), with its
    commonest line, and how many samples it holds: ("decode_record (data.py:88)", 12)."""
    places: Counter = Counter()
    lines: dict[tuple[str, str], Counter] = {}
    for s in samples:
        f = project_frame(s.frames)
        if f is not None:
            key = (f.name, short_path(f.filename))
            places[key] += 1
            lines.setdefault(key, Counter())[f.line] += 1
    if not places:
        return None
    (name, path), k = places.most_common(1)[0]
    return f"{name} ({path}:{lines[(name, path)].most_common(1)[0][0]})", k
