"""A hang forming: the main thread has not moved for longer than any wait of its steps in the
window, but not yet for the stuck verdict's time. Pure: the stuck verdict and the main thread's
samples in.

Between "one step's wait" and "stuck" the step's findings read a hang's evidence as a step's: a
BERT job whose kernel never ended sat in `loss.item()` and was told "host-device syncs every step"
for 4 s before the stuck verdict came (H200); on NCCL a rank blocked behind a peer that never
arrives read as host-sync and launch-bound. While the thread stands still that long, the advisor
says what it weighs (a hang, or one long step) and holds the step's findings until it moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..model import StackSample
from .classify import stack_key
from .stuck import StuckVerdict
from .threshold import JUDGEMENT, Threshold

# The main thread unchanged at least this long. Judgement: longer than one step's wait of nearly
# every training job (a step of a large model is a few seconds; its sync waits are shorter), and
# long enough that 5 Hz sampling has seen ~15 identical stacks.
FORMING_MIN_S = Threshold(
    3.0, "s", JUDGEMENT,
    "The main thread unchanged at least this long may be a hang forming: longer than one step's wait of nearly "
    "every training job, and ~15 identical stacks at 5 Hz.")
# ...and at least this many times its longest earlier unchanged stretch in the window: a job whose
# steps each wait 2 s in a sync is not hanging at 3 s. Judgement.
FORMING_FACTOR = Threshold(
    3.0, "x", JUDGEMENT,
    "The main thread unchanged at least this many times its longest earlier unchanged stretch in the window: a "
    "job whose every step waits 2 s in a sync is not hanging at 3 s.")


@dataclass(frozen=True)
class Forming:
    held_s: float  # the main thread unchanged this long
    where: str  # "file:line in function"
    longest_before_s: float  # its longest earlier unchanged stretch in the window (0: none seen)
    stuck_at_s: float  # when the stuck verdict's own time is reached
    # Every other rank's GPU spins in a collective now: they wait too, so no rank is slow and the
    # ranks' own findings (a straggler, a collective's cost) would read the hang's wait as a step's.
    peers_wait: bool = False


def longest_run(main: Sequence[StackSample], until: float) -> float:
    """The longest stretch of identical consecutive stacks among ``main`` before ``until``: from
    a stack's first sample to the first sample that differs."""
    longest, start, key = 0.0, None, None
    for s in main:
        if s.ts >= until:
            break
        k = stack_key(s.frames)
        if k != key:
            if start is not None:
                longest = max(longest, s.ts - start)
            start, key = s.ts, k
    if start is not None:
        longest = max(longest, until - start)
    return longest


def hang_forming(stuck: StuckVerdict | None, main: Sequence[StackSample], stuck_after_s: float,
                 gpu_computing: bool = False) -> Forming | None:
    """The hang forming now (see the module), or None: stuck already, moving, never still for long
    against its own steps, or its GPU computing meanwhile (``gpu_computing``: a poll since the
    stillness began busy with work, not a spin; or busy with no poll to tell)."""
    if stuck is None or stuck.stuck or stuck.since is None or stuck.works is not None:
        return None  # stuck already, or its workers, GPU or I/O work while it waits: a long wait
    if gpu_computing:
        # A GPU computing (not spinning) while the thread waits in a sync is a long step's wait:
        # a compute-bound loop reading `loss.item()` every step samples the same stack for
        # seconds. The stuck verdict weighs that case at its own time; a spinning GPU is a hang's.
        return None
    if stuck.held_s < FORMING_MIN_S or stuck.held_s >= stuck_after_s:
        return None
    before = longest_run(main, stuck.since)
    if stuck.held_s < FORMING_FACTOR * before:
        return None
    return Forming(stuck.held_s, stuck.where, before, stuck_after_s)


__all__ = ["FORMING_FACTOR", "FORMING_MIN_S", "Forming", "hang_forming", "longest_run"]
