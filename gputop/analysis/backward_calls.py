"""One graph's backward run again and again in a step: ``loss.backward(retain_graph=True)`` once
per loss. Pure: stack samples in.

A multi-task (or multi-loss) step that calls backward once per loss, keeping the graph for the
next (``for l in losses: l.backward(retain_graph=True)``), runs the shared layers' backward once
per loss; the sum of the losses, backwarded once, gives the same gradients with one pass. A
held-out job (three task heads on a ResNet-50) spent 66 % of its main thread's samples in the
backward, every one from a single line inside a loop nested in the training loop; one backward of
the weighted sum measured 1.43x.

What tells it from the backward a step needs anyway: ``retain_graph`` on the call is only there
for a second backward through the same graph, and where the call's innermost loop is not the
training loop (the loop of the same function's forward and optimizer lines) but one nested
inside it, that second backward is the same line again, in the same step. A retaining call in the
training loop itself (a GAN's discriminator pass, a graph kept across steps on purpose) is said
only as what it is.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ..model import Frame, StackSample
from .classify import is_library, short_path

# Where torch enters the backward: Tensor.backward, torch.autograd.backward and autograd.grad.
_ENTRIES = (("backward", "torch/_tensor.py"), ("backward", "torch/autograd/__init__.py"),
            ("grad", "torch/autograd/__init__.py"))
# ``retain_graph=`` given a value that keeps the graph (anything but False/None/0 as written).
_RETAINS = re.compile(r"retain_graph\s*=\s*(?!(?:False|None|0)\b)")


@dataclass(frozen=True)
class BackwardRepeats:
    """The backward's call site in the user's code and what its samples show."""

    site: str  # "train.py:142"
    fn: str  # the calling function
    code: str  # the call's line as written
    samples: int  # main-thread samples in all
    backward: int  # of them in a backward entered from this site
    retains: bool  # the call keeps the graph (retain_graph=...)
    loop: int  # first line of the call's innermost loop (0: none read)
    step_loop: int  # first line of the loop of the same function's other sampled lines (0: none)

    @property
    def share(self) -> float:
        return self.backward / self.samples if self.samples else 0.0

    @property
    def nested(self) -> bool:
        """The call sits in a loop inside the step's own loop: it runs more than once a step."""
        return bool(self.loop and self.step_loop and self.loop != self.step_loop and self.loop > self.step_loop)


def _name(f: Frame) -> str:
    return f.name.rsplit(".", 1)[-1]


def _entry(frames: Sequence[Frame]) -> int | None:
    """Index (innermost first) of the outermost frame of torch's backward entry, None outside one."""
    at = None
    for i, f in enumerate(frames):
        path = f.filename.replace("\\", "/")
        if any(_name(f) == n and path.endswith(p) for n, p in _ENTRIES):
            at = i
    return at


def _caller(frames: Sequence[Frame], entry: int) -> Frame | None:
    """The user's frame that called into the backward (libraries between, e.g. Lightning's
    manual_backward or accelerate's backward, are passed through)."""
    for f in frames[entry + 1:]:
        if not is_library(f.filename):
            return f
    return None


def backward_repeats(main: Sequence[StackSample], dominance: float = 0.8) -> BackwardRepeats | None:
    """The call site of the main thread's backward, where one site holds at least ``dominance`` of
    the backward samples; None without a backward or with several sites."""
    sites: Counter = Counter()
    frame_of: dict[tuple[str, int], Frame] = {}
    total = 0
    for s in main:
        entry = _entry(s.frames)
        if entry is None:
            continue
        total += 1
        f = _caller(s.frames, entry)
        if f is None:
            continue
        key = (f.filename, f.line)
        sites[key] += 1
        frame_of.setdefault(key, f)
    if not sites:
        return None
    key, k = sites.most_common(1)[0]
    if k < dominance * total:
        return None
    f = frame_of[key]
    # The loop of the same function's other lines (its forward, its optimizer step): the step's.
    loops: Counter = Counter()
    for s in main:
        for g in s.frames:
            if g.filename == f.filename and g.name == f.name and g.line != f.line and g.loop:
                loops[g.loop] += 1
                break
    step_loop = loops.most_common(1)[0][0] if loops else 0
    code = (f.code or "").strip()
    return BackwardRepeats(
        site=f"{short_path(f.filename)}:{f.line}", fn=f.name, code=code, samples=len(main), backward=k,
        retains=bool(_RETAINS.search(code)), loop=f.loop, step_loop=step_loop)
