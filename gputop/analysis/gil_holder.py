"""A thread of the training process that holds the GIL while the training thread waits for it.
Pure: stack samples in, the holder out.

py-spy says of each thread whether it held the GIL at the sample and whether it was running. A
thread that busy-polls in Python (a status or metrics thread looping on a deque with no sleep, a
spin-wait on a flag) holds the GIL most of the time, and CPython hands it over only every switch
interval (5 ms): the training thread, which needs the GIL to launch each kernel, waits in between.
Its own samples then sit on whatever line it was at, idle, reading as the model's forward; the
thread that takes the time is in the other threads' samples only (a held-out rank 0 whose
status-board thread held the GIL in 54 of 55 samples, its main thread never running, was named
"the straggler in Attention.forward").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from ..model import StackSample
from .classify import project_frame, short_path
from .threshold import JUDGEMENT, IntThreshold, Threshold

# The other thread holds the GIL in at least this share of its samples, and the main thread is
# not running in at least this share of its own. Judgement: most of the time, so the training
# thread's wait is the holder's and not a moment's.
GIL_HELD_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "Another thread holding the GIL in at least this share of its samples, while the main thread is not running in "
    "at least this share of its own: the training thread waits for that thread most of the time.")


# ...read from at least this many of its samples. Judgement: a thread seen once holding the GIL
# (a DataParallel worker caught in the model's forward) is no pattern.
GIL_MIN_SAMPLES = IntThreshold(
    8, "samples", JUDGEMENT,
    "The GIL-holding thread read from at least this many samples: one seen once holding it is no pattern.")


@dataclass(frozen=True)
class GilHolder:
    pid: int
    thread: str  # its name ("status-board") or id
    where: str  # its commonest place in the user's code, "StatusBoard._drain (train.py:88)"
    held: float  # share of its samples holding the GIL
    main_waits: float  # share of the main thread's samples not running
    samples: int  # the holder's samples


def gil_holder_of(stacks: Iterable[StackSample], pid: int) -> GilHolder | None:
    """The thread of ``pid`` (not its main one) holding the GIL most while the main thread waits,
    or None."""
    main: list[StackSample] = []
    threads: dict[str, list[StackSample]] = {}
    for s in stacks:
        if s.pid != pid:
            continue
        if s.is_main:
            main.append(s)
        else:
            threads.setdefault(s.thread_name or str(s.thread_id), []).append(s)
    if not main or not threads:
        return None
    main_waits = sum(1 for s in main if not s.active) / len(main)
    if main_waits < GIL_HELD_SHARE:
        return None
    best = None
    for name, ss in threads.items():
        if len(ss) < GIL_MIN_SAMPLES:
            continue
        held = sum(1 for s in ss if s.owns_gil) / len(ss)
        if held >= GIL_HELD_SHARE and (best is None or held > best[1]):
            best = (name, held, ss)
    if best is None:
        return None
    name, held, ss = best
    places = Counter()
    for s in ss:
        f = project_frame(s.frames) or (s.frames[0] if s.frames else None)
        if f is not None:
            places[f"{f.name} ({short_path(f.filename)}:{f.line})"] += 1
    where = places.most_common(1)[0][0] if places else "(no frame)"
    return GilHolder(pid, name, where, held, main_waits, len(ss))


__all__ = ["GIL_HELD_SHARE", "GIL_MIN_SAMPLES", "GilHolder", "gil_holder_of"]
