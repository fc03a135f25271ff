"""Assemble a live session: which sources, one store, one pipeline.

Shared by the UI, the headless recorder and the headless advisor, so all of them see the
machine the same way.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from .errors import UserError
from .model import Event, SystemInfo
from .pipeline import Pipeline, Source
from .store import Store


@dataclass
class Session:
    store: Store
    pipeline: Pipeline
    sources: dict[str, Source] = field(default_factory=dict)
    target_pid: int | None = None
    mode: str = "live"  # live | fake | replay
    stuck_after: float = 30.0
    recording: object | None = None  # the Recorder while one is attached
    interval: float = 2.0  # seconds between samples (a replay: the recorded interval)
    window: float = 60.0  # the advisor's window: its findings speak of the last N seconds
    attach_error: str | None = None  # why the target's stacks cannot be sampled
    # With no job attached only the slow system checks can fire: the interactive UI then runs the
    # advisor this often (seconds) to stay cheap; headless commands, there for the verdict, at once.
    advisor_idle_every: float = 0.0

    def require_stacks(self) -> None:
        """For headless commands whose one question is the target's stacks: raise UserError
        with the reason when they cannot be had (the live UI goes on without them)."""
        if self.attach_error is not None:
            self.pipeline.stop()
            raise UserError(f"{self.attach_error}; without --pid gputop watches the GPUs and the host only")


def open_gpu_source(interval: float, fake: int | None, clock=time.time) -> tuple[Source | None, list[object]]:
    """The GPU source, or None with a SystemInfo saying why NVML is unavailable."""
    if fake is not None:
        from .sources.fake import FakeGpuSource

        return FakeGpuSource(gpus=fake, interval=interval, clock=clock), []
    from .sources.nvml import NvmlSource, NvmlUnavailable

    try:
        return NvmlSource.open(interval=interval, clock=clock), []
    except NvmlUnavailable as exc:
        info = SystemInfo(ts=clock(), hostname=socket.gethostname(), nvml_error=str(exc), source="live")
        return None, [info, Event(info.ts, "nvml", f"NVML unavailable: {exc}", "warning")]


def stacks_source(store: Store, pid: int, stuck_after: float, clock=time.time) -> Source:
    from .session import stack_sampler

    return stack_sampler(pid, clock=clock)


def build_session(
    interval: float = 2.0,
    fake: int | None = None,
    pid: int | None = None,
    stuck_after: float = 30.0,
    store: Store | None = None,
    clock=time.time,
    window: float = 60.0,
) -> Session:
    """Sources for a live machine (or the fake one). Raises UserError for a bad ``pid``."""
    from .sources.host import HostSource

    store = store or Store()
    sources: dict[str, Source] = {}
    attach_note: Event | None = None
    if pid is not None:
        from .sources.stacks import AttachError, check_attachable

        try:
            check_attachable(pid)
        except AttachError as exc:
            # No such process: nothing to monitor, say so before any UI appears. Otherwise
            # (not Python, no permission, py-spy broken) GPU and host monitoring still work.
            if exc.kind == "gone":
                raise
            attach_note = Event(clock(), "stacks", f"cannot sample stacks of PID {pid}: {exc}", "error")
    gpu, notes = open_gpu_source(interval, fake, clock)
    if gpu is not None:
        sources[gpu.name] = gpu
    if notes:
        store.add(notes)

    def pids_to_watch() -> list[int]:
        # The host source reads OS details for whatever holds a GPU, plus the target.
        pids = {p.pid for p in store.gpu_processes()}
        if pid is not None:
            pids.add(pid)
        return sorted(pids)

    sources["host"] = HostSource(
        interval=interval, pids=pids_to_watch, clock=clock, target_pid=pid, top_cpu=0 if gpu is not None else 15
    )
    if pid is not None and attach_note is None:
        sources["stacks"] = stacks_source(store, pid, stuck_after, clock)
    if attach_note is not None:
        store.add([attach_note])
    from .analysis.stuck import StuckWatch

    sources["stuck"] = StuckWatch(store, pid, stuck_after)
    pipeline = Pipeline(store, list(sources.values()), clock=clock)
    mode = "fake" if fake is not None else "live"
    return Session(
        store=store, pipeline=pipeline, sources=sources, target_pid=pid, mode=mode, stuck_after=stuck_after,
        interval=interval, window=window, attach_error=attach_note.message if attach_note is not None else None,
    )
