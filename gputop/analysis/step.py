"""The training step as the main thread's samples show it. Pure: stack samples in.

The stacks' categories say what kind of code a sample was in; the step says where in the loop
it was: the training loop's own frame (the one place of the user's code under nearly every
sample), and each sample's phase of the step: waiting for data, a host-to-device copy, forward,
backward, the optimizer, a sync, a collective, a checkpoint, compiling, importing, or the user's
own code outside the model, named by its function and line. A rule that tells launch-bound
(the model's ops dispatched) from CPU work in the loop (the user's own function) reads the
phases, not the categories alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ..model import Category, Frame, StackSample
from .classify import importing_at, is_library, own_frames, project_frame, short_path
from .threshold import JUDGEMENT, Threshold

# The phases, in the order they are shown.
DATA = "data wait"
H2D = "H2D copy"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
SYNC = "sync"
COLLECTIVE = "collective"
CHECKPOINT = "checkpoint"
COMPILE = "compile"
IMPORT = "import"
GC = "gc"
OUTSIDE = "user code outside the model"
IDLE = "idle"
OTHER = "other"
PHASES = (DATA, H2D, FORWARD, BACKWARD, OPTIMIZER, SYNC, COLLECTIVE, CHECKPOINT, COMPILE, IMPORT, GC, OUTSIDE,
          IDLE, OTHER)

_BY_CATEGORY = {
    Category.DATA_WAIT: DATA, Category.DATA_FETCH: DATA, Category.H2D_COPY: H2D, Category.FORWARD: FORWARD,
    Category.BACKWARD: BACKWARD, Category.OPTIMIZER: OPTIMIZER, Category.HOST_SYNC: SYNC,
    Category.COLLECTIVE: COLLECTIVE, Category.CHECKPOINT_IO: CHECKPOINT, Category.GC: GC, Category.IDLE: IDLE,
}

# Compilation runs under dynamo's frame conversion and inductor's compile; a compiled model's
# steady steps do not (they run from the frame cache, under eval_frame.py only).
COMPILE_FILES = ("torch/_dynamo/convert_frame.py", "torch/_dynamo/symbolic_convert.py",
                 "torch/_dynamo/output_graph.py", "torch/_inductor/compile_fx.py")
# The training loop is the user's frame under at least this share of the samples. Judgement: a
# loop's frame is under every sample of its steps; a fifth aside leaves room for logging, eval and
# checkpoint code called from elsewhere.
LOOP_SHARE = Threshold(
    0.80, "share", JUDGEMENT,
    "The training loop is the user's frame under at least this share of the samples: a fifth aside leaves room for"
    " logging, eval and checkpoint code called from elsewhere.")
# The step's model work: the loop is the frame over these samples (the function that calls
# forward, backward and the optimizer), not a helper beside them.
_MODEL_WORK = frozenset({FORWARD, BACKWARD, OPTIMIZER})
# The DataLoader's own code: a user frame it calls is a Dataset's or a collate function.
_DATALOADER = "torch/utils/data/"
# A frame whose one callee (or none: it runs its own lines) holds this share of its samples is a
# piece of work, not the loop that calls the work. Judgement.
LOOP_ONE_CALLEE = Threshold(
    0.90, "share", JUDGEMENT,
    "A frame whose one callee (or its own lines) holds this share of its samples is a piece of work, not the loop "
    "that calls the work.")


def compiling(frames: Sequence[Frame]) -> bool:
    """dynamo's or inductor's compiling functions run (below any import: importing a compiler's
    modules is importing, not compiling)."""
    imp = importing_at(frames)
    return any(f.name != "<module>" and f.filename.replace("\\", "/").endswith(c)
               for i, f in enumerate(frames) if imp is None or i > imp for c in COMPILE_FILES)


def phase_of(s: StackSample) -> str:
    """One sample's phase of the step."""
    if compiling(s.frames):
        return COMPILE
    if importing_at(s.frames) is not None:
        return IMPORT
    if s.category is Category.OTHER:
        return OUTSIDE if s.active and project_frame(s.frames) is not None else OTHER
    return _BY_CATEGORY.get(s.category, OTHER)


@dataclass(frozen=True)
class StepModel:
    samples: int
    loop: str | None  # the training loop's frame: "train (train.py:40)"
    phases: tuple[tuple[str, float], ...]  # (phase, share of the samples), largest first
    outside: tuple[tuple[str, float], ...]  # the user's own code outside the model: (where, share)

    def share(self, phase: str) -> float:
        return dict(self.phases).get(phase, 0.0)


def _place(f: Frame) -> tuple[str, str]:
    return f.name, short_path(f.filename)


def training_loop(main: Sequence[StackSample]) -> str | None:
    """The newest frame of the user's code that is under at least LOOP_SHARE of the samples and
    calls different things from one sample to the next, with its commonest line: the loop that
    calls everything else. One pass over the samples (a tick's advisor calls this on every one).

    The loop encloses the step. A frame the DataLoader calls (a Dataset's __getitem__, a collate
    function) is never it. Two more kinds are not while a frame that encloses them is a
    candidate: one a library calls back from older user code (a module's forward under
    Module.__call__, a framework's hook), and one outside the step's model work (a logging helper
    under most samples, under none of the forward, backward or optimizer ones)."""
    if not main:
        return None
    under: Counter = Counter()
    lines: dict[tuple[str, str], Counter] = {}
    depth: dict[tuple[str, str], int] = {}
    # The loop calls different things from one sample to the next (the model, the loader, the
    # user's helpers); a slow helper under most samples calls one thing, or nothing of the
    # user's: it is the work, not the loop (a module-level loop spending 80 % in log_metrics()
    # was named "step of log_metrics"). Library callees count as one: the model's ops vary.
    callees: dict[tuple[str, str], Counter] = {}
    called_back: Counter = Counter()  # samples where a library called the frame from older user code
    data_side: Counter = Counter()  # samples where the DataLoader's code called the frame (a dataset's)
    in_work: Counter = Counter()  # model-work samples (forward, backward, optimizer) the frame is under
    work = 0
    for s in main:
        own = own_frames(s.frames)
        is_work = phase_of(s) in _MODEL_WORK
        work += is_work
        seen = set()
        below: object = None  # the callee of the frame being looked at (None: it is the newest)
        keys = [None if is_library(f.filename) else _place(f) for f in own]
        for i, (f, key) in enumerate(zip(own, keys)):
            if key is not None and key not in seen:
                seen.add(key)
                under[key] += 1
                lines.setdefault(key, Counter())[f.line] += 1
                depth[key] = min(depth.get(key, i), i)
                callees.setdefault(key, Counter())[below] += 1
                in_work[key] += is_work
                caller = next((j for j in range(i + 1, len(keys)) if keys[j] is not None), None)
                if caller is not None and caller > i + 1:  # library frames between it and its user caller
                    called_back[key] += 1
                if i + 1 < len(own) and _DATALOADER in own[i + 1].filename.replace("\\", "/"):
                    data_side[key] += 1
            below = "library" if key is None else key
    n = len(main)
    # A dataset's or collate function's frame is the data, never the loop: in a DataLoader
    # worker (or a main thread whose loop is out of view) there is no loop to name.
    common = [k for k, c in under.items() if c / n >= LOOP_SHARE and data_side[k] * 2 < c]
    if not common:
        return None
    # Narrowed only while something is left: a job whose every user frame is a callback (a
    # framework's loop calling the model) still gets its newest common frame.
    enclosing = [k for k in common if called_back[k] * 2 < under[k]] or common
    if work:
        enclosing = [k for k in enclosing if in_work[k] * 2 >= work] or enclosing

    def varied(key: tuple[str, str]) -> bool:
        c = callees[key]
        return c.most_common(1)[0][1] / sum(c.values()) < LOOP_ONE_CALLEE

    # The newest of them (found at the smallest depth from the top: nearest the work) that varies.
    ordered = sorted(enclosing, key=lambda k: depth[k])
    name, path = next((k for k in ordered if varied(k)), ordered[0])
    return f"{name} ({path}:{lines[(name, path)].most_common(1)[0][0]})"


def step_model(main: Sequence[StackSample]) -> StepModel:
    """The step of the main thread's samples (time order)."""
    n = len(main)
    if not n:
        return StepModel(0, None, (), ())
    counts = Counter(phase_of(s) for s in main)
    order = {p: i for i, p in enumerate(PHASES)}
    phases = tuple((p, k / n) for p, k in sorted(counts.items(), key=lambda pk: (-pk[1], order[pk[0]])))
    where: Counter = Counter()
    for s in main:
        if phase_of(s) == OUTSIDE:
            f = project_frame(s.frames)
            if f is not None:
                where[f"{f.name} ({short_path(f.filename)}:{f.line})"] += 1
    outside = tuple((w, k / n) for w, k in where.most_common(3))
    return StepModel(n, training_loop(main), phases, outside)


def step_dict(m: StepModel) -> dict:
    return {"samples": m.samples, "loop": m.loop, "phases": {p: round(sh, 3) for p, sh in m.phases},
            "outside_model": [{"where": w, "share": round(sh, 3)} for w, sh in m.outside]}


def step_line(m: StepModel) -> str:
    """One line: "step of train (train.py:40): data wait 62 %, forward 20 %, … (45 samples)"."""
    if not m.samples:
        return "step: no stacks of the main thread yet"
    parts = ", ".join(f"{p} {100 * sh:.0f} %" for p, sh in m.phases if sh >= 0.01)
    outside = ("; outside the model: " + ", ".join(f"{w} {100 * sh:.0f} %" for w, sh in m.outside)) if m.outside else ""
    return f"step{f' of {m.loop}' if m.loop else ''}: {parts}{outside} ({m.samples} samples)"


__all__ = ["PHASES", "StepModel", "compiling", "phase_of", "step_dict", "step_line", "step_model", "training_loop"]
