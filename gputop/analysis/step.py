"""The training step as the main thread's samples show it. Pure: stack samples in.

The stacks' categories say what kind of code a sample was in; the step says where in the loop
it was: the training loop's own frame (the one place of the user's code under nearly every
sample), and each sample's phase of the step: waiting for data, a host-to-device copy, forward,
backward, the optimizer, evaluation, a sync, a collective, a checkpoint, compiling, importing, or
the user's own code outside the model, named by its function and line. A rule that tells
launch-bound (the model's ops dispatched) from CPU work in the loop (the user's own function)
reads the phases, not the categories alone.

Evaluation is a phase of its own because its samples look like training's: a validation
forward is a forward, its ``.item()`` reads are syncs. Two kinds of evidence tell it apart
(``evaluation``): a frame of evaluation code in the stack (a function of the user's named as
one, ``validate``, ``evaluate``, ``val_step``, ``test``, Lightning's ``validation_step``; or the
frameworks' own evaluation loops, transformers' ``Trainer.evaluate`` / ``evaluation_loop`` /
``prediction_step``, Lightning's ``_EvaluationLoop``), or, inline in the loop's own function, a
forward at a line after the training step's last backward and optimizer lines, with the syncs
and other work at the lines that follow it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ..model import Category, Frame, StackSample
from .classify import importing_at, is_library, own_frames, project_frame, short_path
from .frameworks import HF_TRAINER, LIGHTNING
from .threshold import JUDGEMENT, Threshold

# The phases, in the order they are shown.
DATA = "data wait"
H2D = "H2D copy"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
EVAL = "eval"
SYNC = "sync"
COLLECTIVE = "collective"
CHECKPOINT = "checkpoint"
COMPILE = "compile"
IMPORT = "import"
GC = "gc"
OUTSIDE = "user code outside the model"
IDLE = "idle"
OTHER = "other"
PHASES = (DATA, H2D, FORWARD, BACKWARD, OPTIMIZER, EVAL, SYNC, COLLECTIVE, CHECKPOINT, COMPILE, IMPORT, GC, OUTSIDE,
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
# Start-up, not the step: the loop is looked for among the other samples.
_START_UP = frozenset({IMPORT, COMPILE})
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
    evaluation: "Evaluation | None" = None  # evaluation work among the samples, and how it recurs
    placed: tuple[str, ...] = ()  # each sample's phase, in the order of the samples given
    loop_lines: int = 0  # distinct lines the loop's frame was seen at
    loop_at: tuple[str, str] | None = None  # the loop's (function, short path)

    def share(self, phase: str) -> float:
        return dict(self.phases).get(phase, 0.0)

    @property
    def stepping(self) -> bool:
        """The job is going round its training loop: the samples show more than one of forward,
        backward and the optimizer, or one of them with the loop's frame moving from line to line
        (an evaluation loop). Not so while it loads weights or data, in a loop of its own or under
        one line, whose frame ``loop`` still names."""
        work = sum(1 for p, _ in self.phases if p in _MODEL_WORK)
        return self.loop is not None and (work >= 2 or (work >= 1 and self.loop_lines >= 2))


def _place(f: Frame) -> tuple[str, str]:
    return f.name, short_path(f.filename)


def training_loop(main: Sequence[StackSample]) -> str | None:
    """The training loop's frame with its commonest line, "train (train.py:40)", or None: see
    ``loop_place``."""
    place = loop_place(main)
    return None if place is None else f"{place[0]} ({place[1]}:{place[2]})"


def loop_place(main: Sequence[StackSample], phases: Sequence[str] | None = None) -> tuple[str, str, int] | None:
    """(function, short path, commonest line) of the training loop: the newest frame of the
    user's code that is under at least LOOP_SHARE of the samples and calls different things from
    one sample to the next, with its commonest line: the loop that calls everything else. One
    pass over the samples (a tick's advisor calls this on every one); ``phases``, each sample's
    ``phase_of`` where the caller has them.

    The loop encloses the step. A frame the DataLoader calls (a Dataset's __getitem__, a collate
    function) is never it. Two more kinds are not while a frame that encloses them is a
    candidate: one a library calls back from older user code (a module's forward under
    Module.__call__, a framework's hook), and one outside the step's model work (a logging helper
    under most samples, under none of the forward, backward or optimizer ones)."""
    if not main:
        return None
    # Importing and compiling are the start-up, not the step: attached half a second after launch,
    # the loop was named "<module> (healthy.py:1)", the import line under every sample.
    ph = [phase_of(s) for s in main] if phases is None else list(phases)
    steady = [k for k, p in enumerate(ph) if p not in _START_UP]
    if steady and len(steady) < len(main):
        main, phases = [main[k] for k in steady], [ph[k] for k in steady]
    elif not steady:
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
    for k, s in enumerate(main):
        own = own_frames(s.frames)
        is_work = (phase_of(s) if phases is None else phases[k]) in _MODEL_WORK
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
    return name, path, lines[(name, path)].most_common(1)[0][0]


# --------------------------------------------------------------------------- evaluation

# A function of the user's named as evaluation code, by its bare name (the part after any class or
# `<locals>`), matched whole: evaluate, validate, val_step, eval_epoch, run_validation, test,
# test_step, validation_step (Lightning's hook), predict, prediction_step; not `interval` or
# `get_values`.
_EVAL_NAME = re.compile(
    r"_*(?:(?:run|do)_)?(?:eval|evaluate|evaluation|validate|validation|valid|val|test|predict|prediction)"
    r"(?:_(?:step|steps|loop|epoch|one_epoch|model|batch|batches|pass|fn|once|all))?")
# The frameworks' own evaluation code: (file, the functions of it that evaluate, or None for every
# function in it; the framework). transformers 5.2x: Trainer._evaluate -> evaluate ->
# evaluation_loop -> prediction_step (and predict, Seq2SeqTrainer's); not _maybe_log_save_evaluate,
# which also logs and saves. Lightning 2.x (and pytorch_lightning 1.x): the whole of its evaluation
# loops (`_EvaluationLoop.run`, `_evaluation_step`, their hooks), under fit's validation as under
# trainer.validate().
_EVAL_LIBRARY: tuple[tuple[str, frozenset[str] | None, str], ...] = (
    ("/transformers/trainer.py",
     frozenset({"evaluate", "_evaluate", "evaluation_loop", "prediction_step", "prediction_loop", "predict"}), HF_TRAINER),
    ("/transformers/trainer_seq2seq.py", frozenset({"evaluate", "predict", "prediction_step"}), HF_TRAINER),
    ("/lightning/pytorch/loops/evaluation_loop.py", None, LIGHTNING),
    ("/pytorch_lightning/loops/evaluation_loop.py", None, LIGHTNING),
    ("/lightning/pytorch/loops/epoch/evaluation_epoch_loop.py", None, LIGHTNING),
    ("/pytorch_lightning/loops/epoch/evaluation_epoch_loop.py", None, LIGHTNING),
    ("/lightning/pytorch/loops/dataloader/evaluation_loop.py", None, LIGHTNING),
    ("/pytorch_lightning/loops/dataloader/evaluation_loop.py", None, LIGHTNING),
)
# Phases a frame of evaluation code does not claim: the training step's own (no evaluation
# backpropagates or steps an optimizer) and warm-up's.
_NOT_EVAL = frozenset({BACKWARD, OPTIMIZER, COMPILE, IMPORT})
# The work at an inline evaluation's lines of the loop: its forward, its syncs (`.item()`), its
# metrics on the CPU, its batches' copies and loading.
_INLINE_EVAL = frozenset({FORWARD, SYNC, OUTSIDE, H2D, DATA})
# How the evaluation was told: a frame of evaluation code, or a forward after the training
# step's last backward and optimizer lines in the loop's own function.
NAMED, INLINE = "named", "inline"


@dataclass(frozen=True)
class Evaluation:
    """Evaluation work among the main thread's samples, and how it recurs between training."""

    samples: int  # main-thread samples in evaluation work (its forward, its syncs, its data)
    how: str  # NAMED or INLINE
    where: tuple[str, ...]  # its places, commonest first: "validate (u/train.py:80)", "main (u/train.py:55)"
    lines: tuple[str, ...]  # the loop's lines it runs at (its 3 commonest, in source order), with their code:
    #                         "`out = model(vx)` (u/train.py:55)"
    framework: str | None  # HF_TRAINER or LIGHTNING where it is that framework's own evaluation loop
    at: str | None  # the loop's lines it runs at, short: "u/train.py:55-56"; None: no loop frame under it
    bursts: int  # separate evaluations after training: changes from training to evaluation, in time order
    between: int  # training runs with an evaluation before and after ...
    multi_step: int  # ... of which this many show a second step: a forward after a backward or optimizer sample
    period_s: float | None  # mean time from one evaluation's start to the next; None below two
    burst_s: float  # mean time of one evaluation, from its samples' share of the span

    @property
    def named(self) -> bool:
        """Told by a frame of evaluation code (a function, a framework's loop), not inline."""
        return self.how == NAMED


def _bare(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _eval_frames(frames: Sequence[Frame]) -> list[tuple[int, Frame, str | None]]:
    """The frames of evaluation code in a stack, newest first: (index, frame, the framework, or
    None for the user's own code). Cheap: a name or a file is looked at closer only where a
    substring says it could be one."""
    out = []
    for i, f in enumerate(frames):
        fn = f.filename.replace("\\", "/")
        if "/loops/" in fn or "/transformers/trainer" in fn:
            bare = _bare(f.name)
            hit = next((fw for suffix, names, fw in _EVAL_LIBRARY
                        if fn.endswith(suffix) and (names is None or bare in names)), None)
            if hit is not None:
                out.append((i, f, hit))
                continue
        bare = _bare(f.name).lower()
        if ("val" in bare or "test" in bare or "pred" in bare) and _EVAL_NAME.fullmatch(bare) and not is_library(fn):
            out.append((i, f, None))
    return out


def _code_line(f: Frame) -> str:
    where = f"{short_path(f.filename)}:{f.line}"
    return f"`{f.code.strip()}` ({where})" if f.code else where


def evaluation(main: Sequence[StackSample], phases: Sequence[str],
               loop: tuple[str, str, int] | None) -> tuple[list[str], Evaluation | None]:
    """Each sample's phase with its evaluation work placed (EVAL), and the evaluation seen (None:
    none). ``phases``: each sample's ``phase_of``; ``loop``: ``loop_place``'s.

    A frame of evaluation code claims the sample (all but backward, optimizer and warm-up phases)
    unless the frame is the training's own: under a backward or optimizer sample, or, for a
    function of the user's, called at a loop line whose next line of model work (in the source)
    is a backward that has no forward of its own: that function's forward is the loss the
    backward propagates (`loss = predict(model, x)`; `loss.backward()`).

    Inline evaluation in the loop's own function is a forward at a loop line after the training
    step's last backward and optimizer lines; it and the syncs, copies, loading and CPU work at
    that line and the lines after it are the evaluation's. Only with a backward seen: before it,
    no line is known to follow the training step."""
    n = len(main)
    out = list(phases)
    at: list[Frame | None] = [None] * n
    if loop is not None:
        name, path, _ = loop
        for k, s in enumerate(main):
            at[k] = next((f for f in s.frames if f.name == name and short_path(f.filename) == path), None)
    line = [None if f is None else f.line for f in at]
    found = [_eval_frames(s.frames) for s in main]
    fwd = {line[k] for k in range(n) if phases[k] == FORWARD and not found[k] and line[k] is not None}
    # A line is the step's backward (optimizer) line where that is at least as common there as the
    # forward: py-spy reads a caller's line and its callee's frames a moment apart, so a few
    # samples of line 11's `opt.step()` come stamped with line 13, where a metric's forward runs
    # every step (a new user's job: 2 of 82 samples), and would put the step's end after it.
    per_line: dict[int, Counter] = {}
    for k in range(n):
        if line[k] is not None and phases[k] in (FORWARD, BACKWARD, OPTIMIZER):
            per_line.setdefault(line[k], Counter())[phases[k]] += 1
    back = {x for x, c in per_line.items() if c[BACKWARD] and c[BACKWARD] >= c[FORWARD]}
    opt = {x for x, c in per_line.items() if c[OPTIMIZER] and c[OPTIMIZER] >= c[FORWARD]}

    def key(f: Frame) -> tuple[str, str]:
        return f.name, short_path(f.filename)

    training = {key(f) for k in range(n) if phases[k] in (BACKWARD, OPTIMIZER) for _, f, _ in found[k]}
    called: dict[tuple[str, str], Counter] = {}
    for k in range(n):
        for _, f, fw in found[k]:
            if fw is None and phases[k] not in _NOT_EVAL and line[k] is not None:
                called.setdefault(key(f), Counter())[line[k]] += 1
    for fkey, at_lines in called.items():
        call = at_lines.most_common(1)[0][0]
        later = [x for x in back | opt | fwd if x > call]
        if call not in back and later and min(later) in back and min(later) not in fwd:
            training.add(fkey)

    places: Counter = Counter()
    frameworks: Counter = Counter()
    named = 0
    for k in range(n):
        if phases[k] in _NOT_EVAL:
            continue
        good = [(i, f, fw) for i, f, fw in found[k] if key(f) not in training]
        if not good:
            continue
        _, f, fw = good[-1]  # the outermost: the evaluation's entry, nearest the loop
        out[k] = EVAL
        named += 1
        places[f"{f.name} ({short_path(f.filename)}:{f.line})"] += 1
        if fw is not None:
            frameworks[fw] += 1
    inline = 0
    if loop is not None and back:
        last = max(back | opt)
        starts = [line[k] for k in range(n) if out[k] == FORWARD and line[k] is not None and line[k] > last]
        if starts:
            first = min(starts)
            for k in range(n):
                if out[k] in _INLINE_EVAL and line[k] is not None and line[k] >= first:
                    out[k] = EVAL
                    inline += 1
                    places[f"{loop[0]} ({loop[1]}:{line[k]})"] += 1
    evals = named + inline
    if not evals:
        return out, None
    code: dict[int, str] = {}
    at_line: Counter = Counter()
    for k in range(n):
        f = at[k]
        if out[k] == EVAL and f is not None:
            at_line[f.line] += 1
            if f.line not in code or (f.code and "`" not in code[f.line]):
                code[f.line] = _code_line(f)
    top = sorted(x for x, _ in at_line.most_common(3))
    at_text = None
    if loop is not None and top:
        at_text = f"{loop[1]}:{top[0]}" + (f"-{top[-1]}" if top[-1] != top[0] else "")
    return out, _recurrence(main, out, evals, NAMED if named >= inline else INLINE,
                            tuple(w for w, _ in places.most_common(3)), tuple(code[x] for x in top),
                            frameworks.most_common(1)[0][0] if frameworks else None, at_text)


def _recurrence(main: Sequence[StackSample], phases: Sequence[str], evals: int, how: str, where: tuple[str, ...],
                lines: tuple[str, ...], framework: str | None, at: str | None) -> Evaluation:
    """How the evaluation recurs between training, in time order: each change from training
    (forward, backward, optimizer) to evaluation is one evaluation; a training run between two
    of them that shows a forward after a backward or an optimizer sample held a second step."""
    bursts = between = multi = 0
    starts: list[float] = []
    prev: str | None = None
    seen_eval = stepped = second = False
    for s, p in zip(main, phases):
        if p == EVAL:
            if prev == "train":
                bursts += 1
                starts.append(s.ts)
                if seen_eval:
                    between += 1
                    multi += second
            seen_eval, stepped, second, prev = True, False, False, "eval"
        elif p in _MODEL_WORK:
            if prev != "train":
                stepped = second = False
            if p == FORWARD and stepped:
                second = True
            if p in (BACKWARD, OPTIMIZER):
                stepped = True
            prev = "train"
    n = len(main)
    interval = (main[-1].ts - main[0].ts) / (n - 1) if n > 1 else 0.0
    period = (starts[-1] - starts[0]) / (len(starts) - 1) if len(starts) > 1 else None
    return Evaluation(evals, how, where, lines, framework, at, bursts, between, multi, period,
                      evals * interval / max(1, bursts))


def model_work(phase: str) -> bool:
    """Forward, backward or the optimizer: the step's own work."""
    return phase in _MODEL_WORK


def step_model(main: Sequence[StackSample]) -> StepModel:
    """The step of the main thread's samples (time order)."""
    n = len(main)
    if not n:
        return StepModel(0, None, (), ())
    base = [phase_of(s) for s in main]
    loop = loop_place(main, base)
    placed, ev = evaluation(main, base, loop)
    counts = Counter(placed)
    order = {p: i for i, p in enumerate(PHASES)}
    phases = tuple((p, k / n) for p, k in sorted(counts.items(), key=lambda pk: (-pk[1], order[pk[0]])))
    where: Counter = Counter()
    for s, p in zip(main, placed):
        if p == OUTSIDE:
            f = project_frame(s.frames)
            if f is not None:
                where[f"{f.name} ({short_path(f.filename)}:{f.line})"] += 1
    outside = tuple((w, k / n) for w, k in where.most_common(3))
    lines = set()
    if loop is not None:
        for s in main:
            f = next((f for f in s.frames if f.name == loop[0] and short_path(f.filename) == loop[1]), None)
            if f is not None:
                lines.add(f.line)
    return StepModel(n, None if loop is None else f"{loop[0]} ({loop[1]}:{loop[2]})", phases, outside, ev,
                     tuple(placed), len(lines), None if loop is None else (loop[0], loop[1]))


def training_since(main: Sequence[StackSample], m: StepModel) -> float | None:
    """Since when the main thread has stayed in the loop it does the step's work in: the loop
    the samples of forward, backward or the optimizer are in (the training loop's frame, and in
    it which of its loops, ``Frame.loop``), from the first sample after the last one outside it.
    One sample of the work is enough to know the loop; a loop that sleeps or waits on its data
    most of the time is still that loop. Without the loops read (a recording from before them,
    a file that does not parse): from the first sample of the work. None: no work seen."""
    if m.loop_at is None or len(m.placed) != len(main):
        return None

    def loop_of(s: StackSample) -> int | None:
        f = next((f for f in s.frames if f.name == m.loop_at[0] and short_path(f.filename) == m.loop_at[1]), None)
        return None if f is None else f.loop

    work = [k for k, p in enumerate(m.placed) if p in _MODEL_WORK]
    if not work:
        return None
    loops = {loop_of(main[k]) for k in work} - {None, 0}
    if not loops:
        return main[work[0]].ts
    start = len(main)
    while start > 0 and loop_of(main[start - 1]) in loops and m.placed[start - 1] not in _START_UP:
        start -= 1
    return main[start].ts if start < len(main) else None


def step_dict(m: StepModel) -> dict:
    d = {"samples": m.samples, "loop": m.loop, "phases": {p: round(sh, 3) for p, sh in m.phases},
         "outside_model": [{"where": w, "share": round(sh, 3)} for w, sh in m.outside]}
    e = m.evaluation
    if e is not None:
        d["evaluation"] = {
            "samples": e.samples, "how": e.how, "where": list(e.where), "lines": list(e.lines),
            "framework": e.framework, "at": e.at, "evaluations": e.bursts, "training_runs_between": e.between,
            "runs_with_a_second_step": e.multi_step,
            "period_s": None if e.period_s is None else round(e.period_s, 2), "each_s": round(e.burst_s, 2)}
    return d


def step_line(m: StepModel) -> str:
    """One line: "step of train (train.py:40): data wait 62 %, forward 20 %, … (of 45 main-thread samples)".

    Shares of the main thread's samples, said so: beside the device's time split (the GPU's idle time
    by cause, or a CPU job's time weighted by the spacing of its samples) the two read as disagreeing
    numbers otherwise (a new user: "waiting for data 32 %" above, "data wait 19 %" here)."""
    if not m.samples:
        return "step: no stacks of the main thread yet"
    parts = ", ".join(f"{p} {100 * sh:.0f} %" for p, sh in m.phases if sh >= 0.01)
    outside = ("; outside the model: " + ", ".join(f"{w} {100 * sh:.0f} %" for w, sh in m.outside)) if m.outside else ""
    return f"step{f' of {m.loop}' if m.loop else ''}: {parts}{outside} (of {m.samples} main-thread samples)"


__all__ = ["EVAL", "INLINE", "NAMED", "PHASES", "Evaluation", "StepModel", "compiling", "evaluation", "loop_place",
           "phase_of", "step_dict", "step_line", "step_model", "training_loop"]
