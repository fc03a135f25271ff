"""Where in the step a piece of the user's work runs: before the forward (it prepares the batch)
or after the backward pass and the update (work of its own: an EMA of the weights, a metric, a log).
Pure: stack samples in.

The change that fits differs: input work goes to DataLoader workers; work after the update goes
on the GPU, every N steps, or off the training thread. A rank that spent 73 % of its time in
`update_ema` (every weight copied to the host after each step) was told to move "the slow input
work into DataLoader workers", which would not touch it (keeping the EMA on the GPU measured
6.73x, 2 x H200). The order is read from the training loop's own lines: the line the loop was at
when each sample was taken, for the work, the forward and the optimizer.
"""

from __future__ import annotations

from collections import Counter
from statistics import median
from typing import Sequence

from ..model import StackSample
from .classify import short_path
from .step import BACKWARD, FORWARD, OPTIMIZER, phase_of, training_loop

BEFORE_FORWARD = "before the forward"
AFTER_UPDATE = "after the backward pass"


def _loop_key(loop: str) -> tuple[str, str] | None:
    """("main", "train.py") from training_loop's "main (train.py:40)"."""
    name, _, rest = loop.partition(" (")
    path = rest.rsplit(":", 1)[0] if rest else ""
    return (name, path) if name and path else None


def when_in_step(main: Sequence[StackSample], function: str) -> str | None:
    """Whether ``function`` (a name, or "name (file:line)") runs BEFORE_FORWARD or AFTER_UPDATE in
    the training loop of ``main`` (one thread's samples): the loop's line when the work was
    sampled against its lines under the model's work (forward, backward, optimizer). None where
    the loop or its model work is not seen, or the work sits between them."""
    loop = training_loop(main)
    key = _loop_key(loop) if loop else None
    if key is None:
        return None
    name = function.split(" (")[0]
    work: Counter[int] = Counter()
    model: Counter[int] = Counter()  # the loop's lines under the forward, the backward and the optimizer
    for s in main:
        at = next((f.line for f in s.frames if f.name == key[0] and short_path(f.filename) == key[1]), None)
        if at is None:
            continue
        if any(f.name == name for f in s.frames if f.name != key[0]):
            work[at] += 1
        elif phase_of(s) in (FORWARD, BACKWARD, OPTIMIZER):
            model[at] += 1
    # A line's role is what most of its samples do: a torn non-blocking dump stamps an optimizer
    # frame on the line that calls the work, or the work on the model's line (a new user's job,
    # its fetch() on lines 9-13 and its whole step on line 14, read "optimizer at line 9" once
    # and flipped between "before the forward" and unknown from one watch to the next).
    work_lines = [ln for ln, k in work.items() for _ in range(k) if k >= model[ln]]
    model_lines = [ln for ln, k in model.items() if k > work[ln]]
    if not work_lines or not model_lines:
        return None
    line = median(work_lines)
    if line > max(model_lines):
        return AFTER_UPDATE
    if line < min(model_lines):
        return BEFORE_FORWARD
    return None


__all__ = ["AFTER_UPDATE", "BEFORE_FORWARD", "when_in_step"]
