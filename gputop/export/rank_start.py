"""Whether an attached rank is still starting (importing, joining its process group, compiling,
its first few samples), and when its start-up ended. Pure: a rank's main-thread stack samples in,
the answer out.

Why the exporter says so: a rank's phase shares and wait are read over the window, and a window
that still holds the rank's imports reads as a rank that waits for nobody and does "other" work.
Judged from such a window, ranks that are importing torch get "no straggler" and ranks waiting in
the rendezvous for a late peer get "stuck". So a rank reads as starting until it has run past its
start-up for a few samples, and its shares are then read from the samples after its start-up
only (``steady_since``): the job view does not judge a rank from its imports.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ..advisor import MIN_MAIN_SAMPLES
from ..analysis import compiling, importing_at, own_frames
from ..model import Frame, StackSample

IMPORTING = "importing"
JOINING = "joining the process group"
COMPILING = "compiling (torch.compile)"
FIRST_STEPS = "first steps"
FEW_SAMPLES = "too few stack samples yet"  # attached to a rank that was running already
NO_SAMPLES = "no stack sample yet"

# The last few seconds of a rank's samples in start-up in at least this share: it is starting.
# The advisor's own warm-up thresholds (advisor.context: WARMUP_RECENT_S, WARMUP_SHARE): 25
# samples at 5 Hz, half of them, so one lazy import mid-run does not count.
RECENT_S = 5.0
SHARE = 0.5
# torch.distributed's start-up: the process group, its rendezvous and store, and the barrier
# that ends init. Ranks wait here for the last rank to arrive: waiting to start, not a hang.
_JOIN_FUNCS = frozenset({"init_process_group", "rendezvous", "_create_c10d_store", "_store_based_barrier",
                         "_env_rendezvous_handler", "_tcp_rendezvous_handler", "_new_process_group_helper",
                         "init_device_mesh"})


def _joining(frames: Sequence[Frame]) -> bool:
    return any(f.name in _JOIN_FUNCS and "distributed" in f.filename.replace("\\", "/") for f in frames)


def startup_of(s: StackSample) -> str | None:
    """What start-up work one sample shows, or None."""
    frames = own_frames(s.frames)
    if compiling(frames):
        return COMPILING
    if importing_at(frames) is not None:
        return IMPORTING
    if _joining(frames):
        return JOINING
    return None


def steady_since(main: Sequence[StackSample]) -> float | None:
    """When the rank's start-up ended: the time of the newest sample at which start-up held at
    least ``SHARE`` of the samples of the ``RECENT_S`` before it (a lone lazy import later on
    does not move it); None when the window shows no start-up. ``main`` in time order."""
    kinds = [startup_of(s) is not None for s in main]
    end: float | None = None
    lo, inside = 0, 0
    for i, s in enumerate(main):
        inside += kinds[i]
        while main[lo].ts < s.ts - RECENT_S:
            inside -= kinds[lo]
            lo += 1
        if kinds[i] and inside / (i - lo + 1) >= SHARE:
            end = s.ts
    return end


def starting(main: Sequence[StackSample], now: float, min_samples: int = MIN_MAIN_SAMPLES) -> str:
    """'' once the rank runs its steps; else what it is still doing (``IMPORTING``, ``JOINING``,
    ``COMPILING``; ``FIRST_STEPS``: past its start-up by fewer than ``min_samples`` samples, the
    fewest the straggler test reads; ``FEW_SAMPLES`` or ``NO_SAMPLES``: not enough seen of a rank
    attached while it ran). ``main`` in time order."""
    if not main:
        return NO_SAMPLES
    recent = [s for s in main if s.ts >= now - RECENT_S] or list(main[-1:])
    kinds = Counter(k for k in map(startup_of, recent) if k)
    if kinds and sum(kinds.values()) / len(recent) >= SHARE:
        return kinds.most_common(1)[0][0]
    since = steady_since(main)
    after = sum(1 for s in main if since is None or s.ts > since)
    if after >= min_samples:
        return ""
    return FEW_SAMPLES if since is None else FIRST_STEPS
