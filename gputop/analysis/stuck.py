"""Is the attached job stuck? Pure: reads the store, returns a verdict.

Stuck means: the main thread's Python stack has not changed for ``threshold`` seconds and the
GPU work of the target has stopped (or cannot be seen: no NVML, or the target holds no GPU
context we can see, e.g. from inside another PID namespace). A training loop that progresses
moves its main thread's line many times a second, so an identical stack for tens of seconds is
a hang, a deadlock or a wait that never ends.

An unchanged stack is not proof of no progress, though: a slow loop that spends every step in
one long call looks the same sample after sample. A job whose process tree burns CPU is working;
gputop.analysis.progress says when (``working``). ``StuckWatch`` turns the verdict into events.

One exception to "the GPU has stopped": a main thread inside a collective. A hung NCCL
collective spins its kernel and NVML shows the GPU 100 % busy for as long as it hangs (and its
CPU proves nothing either: see gputop.analysis.progress).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .classify import project_frame, stack_key, where
from ..model import Category, Event, Frame, ProcSample, StackSample
from .progress import CPU_WINDOW_S, activity, working
from ..store import Store
from .efficiency import is_worker

# A job whose main stack and processes have not moved for this long, GPU idle, is called stuck:
# longer than a checkpoint save or an evaluation pass on most jobs, short enough to be noticed
# while someone watches. The one default every command and pane uses.
DEFAULT_STUCK_AFTER_S = 30.0
# NVML utilisation at or below this counts as "no GPU work": an idle GPU reads 0, and a few %
# absorbs a monitoring tool's own blips.
GPU_IDLE_PCT = 5.0
# How far back "the GPU has stopped" looks: five 1 s polls / twenty-five 200 ms buffer points,
# enough not to call a gap between two kernels a stop.
GPU_IDLE_WINDOW_S = 5.0
# With no main-thread sample this recent, sampling has stopped (target gone, py-spy failing):
# no verdict rather than a stale one. Default sampling is 5 Hz.
STALE_AFTER_S = 5.0
# Beyond the threshold, how much history to scan to say how long it has been stuck.
LOOKBACK_EXTRA_S = 60.0


@dataclass(frozen=True)
class StuckVerdict:
    stuck: bool
    reason: str  # one line: why stuck, or why not
    since: float | None = None  # when the main stack last changed (start of the unchanged run)
    held_s: float = 0.0  # how long the main stack has been unchanged
    held_exact: bool = True  # False: unchanged since before the history looked at ("at least")
    where: str = ""  # 'file:line in function' (newest project frame)
    at: Frame | None = None  # that frame (the newest frame when no project frame)
    frame: Frame | None = None  # the newest frame of the main thread
    category: Category | None = None
    gpu: str = "unknown"  # busy | idle | unknown
    others: tuple[StackSample, ...] = ()  # the latest stack of every other thread and worker
    tree_cores: float | None = None  # cores the target + workers used recently (None: unknown)


def gpu_state(store: Store, pid: int, now: float) -> str:
    """'busy', 'idle' or 'unknown' for the GPUs the target holds a context on."""
    procs = [p for p in store.gpu_processes() if p.pid == pid]
    if not procs:
        return "unknown"
    if any(p.sm_util is not None for p in procs):
        # Per-process SM utilisation: not confused by other jobs on the same GPU.
        return "busy" if any((p.sm_util or 0) > GPU_IDLE_PCT for p in procs) else "idle"
    t0 = now - GPU_IDLE_WINDOW_S
    utils: list[float] = []
    for idx in {p.gpu_index for p in procs}:
        pts = store.util_window(idx, t0, now)
        if pts:
            utils.extend(p.util for p in pts)
        else:
            utils.extend(s.util_gpu for s in store.gpu_window(idx, t0, now) if s.util_gpu is not None)
    if not utils:
        return "unknown"
    return "busy" if max(utils) > GPU_IDLE_PCT else "idle"


def target_gpu_busy(store: Store, pid: int) -> bool | None:
    """Whether the target's GPU work runs now: True/False, None when unknown."""
    state = gpu_state(store, pid, store.now)
    return None if state == "unknown" else state == "busy"


def unchanged_run(main: Sequence[StackSample]) -> tuple[StackSample, StackSample] | None:
    """(first, last) samples of the newest run of identical stacks in one thread's samples
    (time order)."""
    if not main:
        return None
    last = main[-1]
    key = stack_key(last.frames)
    first = last
    for s in reversed(main[:-1]):
        if stack_key(s.frames) != key:
            break
        first = s
    return first, last


def judge(
    main: Sequence[StackSample],
    now: float,
    threshold: float,
    gpu: str = "unknown",
    others: Sequence[StackSample] = (),
    history_start: float | None = None,
    exited: bool = False,
    procs: Mapping[int, Sequence[ProcSample]] | None = None,
) -> StuckVerdict:
    """The verdict from the main thread's samples (time order), the GPU state and, when given,
    the OS's view of the processes (``procs``: pid -> samples, time order; the target's and its
    workers' CPU readings are used)."""
    others = tuple(others)
    if exited:
        return StuckVerdict(False, "the target has exited", gpu=gpu, others=others)
    run = unchanged_run(main)
    if run is None:
        return StuckVerdict(False, "no stack samples of the main thread yet", gpu=gpu, others=others)
    first, last = run
    top = last.frames[0] if last.frames else None
    base = dict(
        since=first.ts,
        where=where(last.frames),
        at=project_frame(last.frames) or top,
        frame=top,
        category=last.category,
        gpu=gpu,
        others=others,
    )
    if now - last.ts > STALE_AFTER_S:
        return StuckVerdict(False, f"no stack sample for {now - last.ts:.0f} s", **base)
    held = now - first.ts
    # The run reaching back to the first sample looked at means "at least this long".
    exact = history_start is None or first is not main[0] or first.ts - history_start > 1.0
    tree = {p: ss for p, ss in (procs or {}).items() if ss and (p == last.pid or is_worker(ss[-1], last.pid))}
    act = activity([s for s in main if s.ts >= first.ts], now, tree)
    cores = act.cores
    base.update(held_s=held, held_exact=exact, tree_cores=cores)
    if held < threshold:
        return StuckVerdict(False, f"main thread moved {held:.0f} s ago", **base)
    why = working(last.category, gpu, act)
    if why is not None:
        return StuckVerdict(False, f"main thread unchanged for {held:.0f} s but {why}", **base)
    gpu_note = {"idle": "GPU idle", "busy": "GPU spinning in a collective"}.get(gpu, "GPU activity unknown")
    cpu_note = "" if cores is None else f", processes at {cores * 100:.0f} % CPU"
    held_text = f"{'' if exact else '≥ '}{held:.0f} s"
    return StuckVerdict(
        True, f"main thread unchanged for {held_text} ({last.category.value}, {gpu_note}{cpu_note})", **base
    )


def latest_others(samples: Sequence[StackSample], pid: int) -> tuple[StackSample, ...]:
    """Newest sample of every thread but the target's main one: the target's other threads
    from its newest dump, and each worker's threads from that worker's newest dump."""
    newest: dict[int, float] = {}
    for s in samples:
        newest[s.pid] = s.ts
    out = [s for s in samples if s.ts == newest[s.pid] and not (s.pid == pid and s.is_main)]
    out.sort(key=lambda s: (s.pid != pid, s.pid, not s.is_main, s.thread_name))
    return tuple(out)


def stuck_verdict(store: Store, pid: int, threshold: float, now: float | None = None) -> StuckVerdict:
    """The verdict for target ``pid`` from what the store holds."""
    now = store.now if now is None else now
    t0 = now - threshold - LOOKBACK_EXTRA_S
    samples = store.stack_window(t0, now)
    main = [s for s in samples if s.pid == pid and s.is_main]
    proc = store.latest_proc(pid)
    tc0 = now - CPU_WINDOW_S
    procs = {p: store.proc_window(p, tc0, now) for p in store.procs_latest()}
    return judge(
        main,
        now,
        threshold,
        gpu=gpu_state(store, pid, now),
        others=latest_others(samples, pid),
        history_start=t0,
        exited=proc is not None and proc.status in ("exited", "zombie"),
        procs=procs,
    )


class StuckWatch:
    """The stuck verdict as a pipeline stage: one Event (source ``stuck``) when the attached job
    becomes stuck, one when its main thread moves again, for the event log, the status line and
    recordings. It reads the same ``stuck_verdict`` the pane and the advisor's stuck rule read:
    there is one stuck detector. ``target_pid`` may be a callable, to follow the session."""

    name = "stuck"

    def __init__(self, store: Store, target_pid, threshold: float, interval: float = 1.0) -> None:
        self.store = store
        self.threshold = threshold
        self.interval = interval
        self._target = target_pid if callable(target_pid) else (lambda: target_pid)
        self._reported: tuple[int, float] | None = None  # (pid, start of the stuck run)

    def poll(self) -> list[object]:
        pid = self._target()
        if pid is None or self.store.now <= 0:
            return []
        v = stuck_verdict(self.store, pid, self.threshold)
        now = self.store.now
        if self._reported is not None:
            was_pid, since = self._reported
            if was_pid != pid:
                self._reported = None
            elif v.since is not None and v.since > since:  # a new unchanged run: it moved
                self._reported = None
                return [Event(now, self.name, f"main thread of PID {pid} is moving again", "info")]
            else:
                return []
        if not v.stuck:
            return []
        self._reported = (pid, v.since or now)
        gpu_note = {"idle": "GPU idle", "busy": "GPU spinning in a collective"}.get(v.gpu, "GPU activity unknown")
        cpu_note = "" if v.tree_cores is None else f", processes at {v.tree_cores * 100:.0f} % CPU"
        held = f"{'' if v.held_exact else '≥ '}{v.held_s:.0f} s"
        category = v.category.value if v.category is not None else "?"
        return [Event(now, self.name, f"PID {pid} looks stuck: main thread unchanged for {held} at {v.where} "
                                      f"({category}, {gpu_note}{cpu_note})", "warning")]

    def close(self) -> None:
        pass
