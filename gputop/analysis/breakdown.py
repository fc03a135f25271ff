"""Where one GPU's time went over a window: busy, or idle for a reason.

Each 200 ms utilisation slice splits into busy and idle seconds (see ``idle``). The idle part is
shared among what the target's main thread was doing during that slice, from the stack samples
taken in it: a GPU with nothing queued is waiting for whatever the thread that feeds it is busy
with. Host and GPU counters over the same slice refine the answer (a data wait while the disks
make the CPUs wait is IO; unattributed idle while PCIe carries gigabytes is a copy). Every second
of the window lands in exactly one bucket, so the percentages add up to 100.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, Iterable, Mapping, Sequence, TypeVar

from .classify import is_library, own_frames
from ..model import Category, GpuSample, HostSample, ProcSample, StackSample, UtilPoint
from .idle import Slice, util_slices
from .threshold import JUDGEMENT, Threshold


class Bucket(str, Enum):
    BUSY = "busy"
    DATA = "data"
    CPU = "cpu"
    SYNC = "sync"
    H2D = "h2d"
    IO = "io"
    COLLECTIVE = "collective"
    CHECKPOINT = "checkpoint"
    UNKNOWN = "unknown"


# In display order; the labels are what the user reads.
BUCKET_LABELS: dict[Bucket, str] = {
    Bucket.BUSY: "busy",
    Bucket.DATA: "waiting for data",
    Bucket.CPU: "CPU work in main process",
    Bucket.SYNC: "host-device sync",
    # Either way: a `.to(x)` line does not say which, and PCIe's counters decide the finding
    # (copies-to-host or pageable-h2d), not the bucket (an EMA's downloads read "host-to-device").
    Bucket.H2D: "host-device copies",
    Bucket.IO: "IO wait",
    Bucket.COLLECTIVE: "collective/communication wait",
    Bucket.CHECKPOINT: "checkpoint save",
    Bucket.UNKNOWN: "other/unknown",
}

# What the main thread's activity means for a GPU that has nothing to run. Forward, backward
# and optimizer steps with an idle GPU are the CPU dispatching (Python and launch overhead).
CATEGORY_BUCKET: dict[Category, Bucket] = {
    Category.DATA_WAIT: Bucket.DATA,
    Category.DATA_FETCH: Bucket.DATA,
    Category.HOST_SYNC: Bucket.SYNC,
    Category.H2D_COPY: Bucket.H2D,
    Category.FORWARD: Bucket.CPU,
    Category.BACKWARD: Bucket.CPU,
    Category.OPTIMIZER: Bucket.CPU,
    Category.GC: Bucket.CPU,
    Category.COLLECTIVE: Bucket.COLLECTIVE,
    Category.CHECKPOINT_IO: Bucket.CHECKPOINT,
    Category.IDLE: Bucket.UNKNOWN,
    Category.OTHER: Bucket.CPU,  # only when running; see bucket_of
}

# py-spy samples at ~5 Hz; a slice with no sample of its own borrows the nearest one within
# this distance (one missed sample either side of a 200 ms slice).
STACK_JOIN_S = Threshold(
    0.5, "s", JUDGEMENT,
    "A slice with no stack sample of its own borrows the nearest within this: one missed sample either side of a "
    "200 ms slice at py-spy's ~5 Hz.")
# Host and GPU polls come once a second and describe the second before them; a slice is joined
# with the first poll after its middle, if it came within this long.
POLL_JOIN_S = Threshold(
    2.5, "s", JUDGEMENT,
    "A slice is joined with the first host or GPU poll after its middle if it came within this: polls come once a "
    "second and describe the second before them.")
# Half a core's worth of iowait (summed over cores) while the main thread waits for data means
# the input pipeline is waiting on storage: one loader worker blocked on reads shows as
# ~1/cores of iowait, so the threshold is in cores, not percent.
IOWAIT_MIN_CORES = Threshold(
    0.5, "cores", JUDGEMENT,
    "This much iowait (summed over cores) while the main thread waits for data says the input pipeline waits on "
    "storage: one loader worker blocked on reads shows as ~1/cores.")
# PCIe receive rate that makes unattributed idle look like a copy. A gen3 x16 link carries
# ~12 GB/s, gen5 ~50 GB/s; 1 GB/s during an idle gap means copies fill a visible part of it.
H2D_RX_MIN_BPS = Threshold(
    1e9, "bytes/s", JUDGEMENT,
    "PCIe receive rate that makes unattributed idle look like a copy: 1 GB/s during an idle gap fills a visible "
    "part of a gen3 x16 (~12 GB/s) or gen5 (~50 GB/s) link.")
# ...and only from a poll that was mostly idle (its utilisation below this).
COPY_POLL_MAX_UTIL_PCT = Threshold(
    50.0, "%", JUDGEMENT,
    "A copy is read only from a poll that was mostly idle: its utilisation below this.")
# A slice at least this idle counts as "during idle" for the evidence's sample shares.
EVIDENCE_IDLE_FRACTION = Threshold(
    0.5, "share", JUDGEMENT,
    "A slice at least this idle counts as 'during idle' for the evidence's sample shares.")

# Without a GPU (a CPU-only run, NVML unavailable) the training thread is the device: it
# "computes" when its sample is in the model's step, and every other sample is time the step
# waited for something. Its time line is built from the stack samples themselves.
CPU_DEVICE = -1
COMPUTE_CATEGORIES = frozenset({Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER})


# With no device, a "sync" (loss.item(), .cpu(), .tolist() on a CPU tensor) or a "copy" (.to(device)
# with device cpu) waits for nothing: it reads or copies host memory, the step's own CPU work. A job
# on no GPU was shown "host-device sync 4 %" in its breakdown.
NO_DEVICE_COMPUTE = frozenset({Category.HOST_SYNC, Category.H2D_COPY})


def computing(sample: StackSample) -> bool:
    """On the CPU device: the thread runs the step (the model, the loss, the optimizer, or
    unclassified code it runs, such as a loss function outside any module; a read of a tensor's
    value or a copy, which with no device wait for nothing)."""
    return (sample.category in COMPUTE_CATEGORIES or sample.category in NO_DEVICE_COMPUTE
            or (sample.category is Category.OTHER and sample.active))


def bucket_of(sample: StackSample) -> Bucket:
    if sample.category is Category.OTHER and not sample.active:
        return Bucket.UNKNOWN  # blocked in something the classifier does not know
    return CATEGORY_BUCKET.get(sample.category, Bucket.UNKNOWN)


# A decorator's generic wrapper frame: it says nothing of what the call does.
_WRAPPER = re.compile(r"(^|\.)(wrapper|wrapped|inner|_fn|decorate_context|_no_grad_wrapper|_use_grad|maybe_fallback)$")


def stack_label(sample: StackSample) -> str:
    """A short name for what the thread was doing: the call its own code was making.

    The newest frame in the user's code is where the program stood; the frame it called (a
    library function such as ``__next__`` or ``synchronize``) says what it waited in, e.g.
    ``__next__ (runtime.py:57)``. Without a project frame, the newest frame's name.
    """
    frames = own_frames(sample.frames)
    if not frames:
        return "?"
    for i, f in enumerate(frames):
        if not is_library(f.filename):
            where = f"{_basename(f.filename)}:{f.line}"
            if i > 0:
                # Past a decorator's wrapper (torch.no_grad's decorate_context, functools-style
                # wrappers) to the function it wraps: "ModelEmaV3.update", not "decorate_context".
                j = i - 1
                while j > 0 and _WRAPPER.search(frames[j].name):
                    j -= 1
                return f"{frames[j].name} ({where})"
            # The newest frame is the user's own line: its text names the C call (.item()).
            return f"`{f.code}` ({where})" if f.code else f"{f.name} ({where})"
    return frames[0].name


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


T = TypeVar("T")


class Timeline(Generic[T]):
    """Items with ``.ts``, searchable by time."""

    def __init__(self, items: Iterable[T]) -> None:
        self.items = sorted(items, key=lambda s: s.ts)  # type: ignore[attr-defined]
        self.ts = [s.ts for s in self.items]  # type: ignore[attr-defined]

    def __bool__(self) -> bool:
        return bool(self.items)

    def between(self, t0: float, t1: float) -> list[T]:
        """Items with ``t0 < ts <= t1``."""
        return self.items[bisect.bisect_right(self.ts, t0) : bisect.bisect_right(self.ts, t1)]

    def nearest(self, t: float, within: float) -> T | None:
        i = bisect.bisect_left(self.ts, t)
        best = None
        for j in (i - 1, i):
            if 0 <= j < len(self.ts) and abs(self.ts[j] - t) <= within:
                if best is None or abs(self.ts[j] - t) < abs(self.ts[best] - t):
                    best = j
        return self.items[best] if best is not None else None

    def covering(self, t: float, within: float) -> T | None:
        """The first item at or after ``t`` (a poll describes the time before it), else the
        nearest one before, within ``within`` seconds."""
        i = bisect.bisect_left(self.ts, t)
        if i < len(self.ts) and self.ts[i] - t <= within:
            return self.items[i]
        if i > 0 and t - self.ts[i - 1] <= within:
            return self.items[i - 1]
        return None


@dataclass(frozen=True)
class Breakdown:
    """One GPU's window, in seconds per bucket (they sum to ``total_s``)."""

    gpu_index: int
    t0: float
    t1: float
    seconds: Mapping[Bucket, float]
    attributed: bool  # stack samples of the main thread were available
    idle_samples: int = 0  # main-thread samples taken while the GPU was idle
    # (bucket, label) -> main-thread samples during idle, for the evidence
    idle_labels: Mapping[tuple[Bucket, str], int] = field(default_factory=dict)
    # The main thread's samples in time order, each as the bucket it stands for (BUSY when
    # taken while the GPU was busy): whether a cause came back again and again or was one stall
    # (``recurrences``).
    sequence: tuple[Bucket, ...] = ()

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def busy_s(self) -> float:
        return self.seconds.get(Bucket.BUSY, 0.0)

    @property
    def idle_s(self) -> float:
        return self.total_s - self.busy_s

    def get(self, bucket: Bucket) -> float:
        return self.seconds.get(bucket, 0.0)

    @property
    def idle_fraction(self) -> float:
        total = self.total_s
        return self.idle_s / total if total > 0 else 0.0

    def percentages(self) -> dict[Bucket, int]:
        """Whole percentages that add up to exactly 100 (largest remainder)."""
        return whole_percentages(self.seconds)

    def top_labels(self, bucket: Bucket, n: int = 3) -> list[tuple[str, float]]:
        """The commonest labels during idle in ``bucket``: (label, share of all idle samples)."""
        if not self.idle_samples:
            return []
        rows = [(lab, c) for (b, lab), c in self.idle_labels.items() if b is bucket]
        rows.sort(key=lambda r: (-r[1], r[0]))
        return [(lab, c / self.idle_samples) for lab, c in rows[:n]]

    def recurrences(self, *buckets: Bucket) -> int:
        """How many separate times the main thread was seen in these buckets with the GPU idle:
        runs of consecutive samples. One long stall is one; a wait in most steps, between the
        samples of the step's work, is one per sampled step."""
        inside = [b in buckets for b in self.sequence]
        return sum(1 for k, x in enumerate(inside) if x and (k == 0 or not inside[k - 1]))

    def idle_sample_share(self, bucket: Bucket) -> float:
        if not self.idle_samples:
            return 0.0
        return sum(c for (b, _), c in self.idle_labels.items() if b is bucket) / self.idle_samples


def whole_percentages(seconds: Mapping[Bucket, float]) -> dict[Bucket, int]:
    total = sum(seconds.values())
    if total <= 0:
        return {}
    raw = {b: 100.0 * v / total for b, v in seconds.items()}
    out = {b: int(v) for b, v in raw.items()}
    short = 100 - sum(out.values())
    # Hand the missing points to the largest remainders, ties in display order.
    order = sorted(raw, key=lambda b: (-(raw[b] - out[b]), list(Bucket).index(b)))
    for b in order[:short]:
        out[b] += 1
    return out


def attribute(
    gpu_index: int,
    slices: Sequence[Slice],
    main_stacks: Sequence[StackSample] = (),
    host: Sequence[HostSample] = (),
    gpu_samples: Sequence[GpuSample] = (),
    procs: Sequence[ProcSample] = (),
    cores: int | None = None,
) -> Breakdown:
    """Split the slices' time into buckets.

    ``main_stacks``: the target's main-thread samples; ``procs``: the target and its loader
    workers (a worker in uninterruptible disk sleep is IO evidence); ``cores``: the host's
    logical CPUs (else taken from the host samples).
    """
    stacks = Timeline(main_stacks)
    hosts = Timeline(host)
    gpus = Timeline(gpu_samples)
    disk_sleep = Timeline(p for p in procs if p.status == "disk-sleep")
    seconds: dict[Bucket, float] = {b: 0.0 for b in Bucket}
    # (bucket, stack) -> samples during idle; stacks are labelled once at the end (py-spy's
    # parser shares one frames tuple per distinct stack, so there are few of them)
    during_idle: Counter[tuple[Bucket, tuple]] = Counter()
    idle_samples = 0
    sequence: list[Bucket] = []

    def io_evidence(t: float) -> bool:
        h = hosts.covering(t, POLL_JOIN_S)
        if h is not None:
            n = cores or len(h.cores) or 1
            if h.iowait_percent / 100.0 * n >= IOWAIT_MIN_CORES:
                return True
        return disk_sleep.nearest(t, POLL_JOIN_S / 2) is not None

    def copy_evidence(t: float) -> bool:
        # The rate is a poll's (1 s): it speaks for an idle gap only when that poll was mostly
        # idle itself, not a busy second that happened to contain a short gap.
        g = gpus.covering(t, POLL_JOIN_S)
        return (
            g is not None
            and (g.pcie_rx_bps or 0.0) >= H2D_RX_MIN_BPS
            and g.util_gpu is not None
            and g.util_gpu < COPY_POLL_MAX_UTIL_PCT
        )

    def refine(b: Bucket, t: float) -> Bucket:
        if b is Bucket.DATA:
            return Bucket.IO if io_evidence(t) else b
        if b is Bucket.UNKNOWN:
            if copy_evidence(t):
                return Bucket.H2D
            if io_evidence(t):
                return Bucket.IO
        return b

    for s in slices:
        busy = s.busy_s
        idle = s.duration - busy
        seconds[Bucket.BUSY] += busy
        inside = stacks.between(s.start, s.end)
        if idle <= 0:
            sequence.extend(Bucket.BUSY for _ in inside)
            continue
        if len(inside) == 1 or not inside:
            x = inside[0] if inside else stacks.nearest(s.mid, STACK_JOIN_S)
            b = refine(bucket_of(x) if x is not None else Bucket.UNKNOWN, s.mid)
            seconds[b] += idle
            sequence.extend(b for _ in inside)
        else:
            weights: dict[Bucket, int] = {}
            for x in inside:
                b = bucket_of(x)
                weights[b] = weights.get(b, 0) + 1
            for b, w in weights.items():
                seconds[refine(b, s.mid)] += idle * w / len(inside)
            sequence.extend(refine(bucket_of(x), s.mid) for x in inside)
        if inside and idle >= EVIDENCE_IDLE_FRACTION * s.duration:
            for x in inside:
                idle_samples += 1
                during_idle[(bucket_of(x), x.frames)] += 1
    labels: Counter[tuple[Bucket, str]] = Counter()
    by_stack = {x.frames: x for x in main_stacks}
    for (b, frames), n in during_idle.items():
        labels[(b, stack_label(by_stack[frames]))] += n
    t0 = slices[0].start if slices else 0.0
    t1 = slices[-1].end if slices else 0.0
    return Breakdown(
        gpu_index=gpu_index,
        t0=t0,
        t1=t1,
        seconds={b: v for b, v in seconds.items() if v > 0 or b is Bucket.BUSY},
        attributed=bool(stacks),
        idle_samples=idle_samples,
        idle_labels=dict(labels),
        sequence=tuple(sequence),
    )


# The longest spacing between two main-thread samples that still stands for the time between
# them on the CPU device's time line. NVML's 1 s (idle.MAX_SLICE_S: its buffer's gap is lost
# data) does not fit stacks: after the attach burst the sampler's CPU budget gives ~1-2 stacks/s,
# fewer on a loaded machine, and a 1 s bar dropped most of a recording (a new user's 22 s
# recording was summarised over 4.4 s, and advise alike). 5 s, as for NVML's polls
# (idle.MAX_POLL_SLICE_S): a longer silence is a sampler that stalled, not a measurement.
STACK_MAX_GAP_S = Threshold(
    5.0, "s", JUDGEMENT,
    "The longest spacing between main-thread samples that still stands for the time between them on the CPU "
    "device's time line, as for NVML's polls (MAX_POLL_SLICE_S): a longer silence is a sampler that stalled.")


def stack_slices(main_stacks: Sequence[StackSample], t0: float, t1: float) -> list[Slice]:
    """The CPU device's time line: each main-thread sample stands for the time since the one
    before it (samples are evenly spaced), busy when the thread was running the step."""
    points = [UtilPoint(x.ts, CPU_DEVICE, 100.0 if computing(x) else 0.0) for x in main_stacks]
    return util_slices(points, t0, t1, max_slice=stack_max_gap(main_stacks))


# A spacing this many times the samples' usual one is a silence (the sampler stalled, the data
# lost), whatever the usual spacing is. Judgement: jitter around a held-back rate stays well under
# it.
STACK_GAP_SPACINGS = Threshold(
    3.0, "x", JUDGEMENT,
    "A spacing this many times the samples' usual one is a silence (the sampler stalled), whatever the usual "
    "spacing: jitter around a held-back rate stays well under it.")


def stack_max_gap(main_stacks: Sequence[StackSample]) -> float:
    """The longest spacing that still stands for the time between two samples: STACK_MAX_GAP_S,
    or more where the sampler itself spaced the samples further apart (held back on a saturated
    host, or by a slow py-spy: 5-7 s apart, and a 22 s recording was summarised over 1 s)."""
    ts = sorted(x.ts for x in main_stacks)
    gaps = sorted(b - a for a, b in zip(ts, ts[1:]) if b > a)
    if not gaps:
        return STACK_MAX_GAP_S
    return max(STACK_MAX_GAP_S, STACK_GAP_SPACINGS * gaps[len(gaps) // 2])
