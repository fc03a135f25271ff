"""The one place a session is assembled: which sources, one store, one pipeline, the advisor,
and a recorder while one is attached.

Live, fake and replay are the same pipeline with a different source. The commands build a
``Config`` from their arguments and open a session here; the UI receives a finished session and
only renders it and calls its verbs (``attach``, ``start_recording``, ``stop_recording``); the
headless commands call ``run_for``. Defaults are written once, in ``Config``.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from .advisor import DEFAULT_WINDOW_S
from .analysis import DEFAULT_STUCK_AFTER_S, RAS_POLL_S
from .errors import UserError
from .model import Event, GpuSample, HostSample, SystemInfo, TargetState, TargetStatus
from .pipeline import Pipeline, Source
from .store import Store

if TYPE_CHECKING:
    from .advisor import AdvisorSource, JobStage
    from .record import Recorder, ReplaySource
    from .sources import HostSource, Job, PySpySource

# NVML keeps a 200 ms utilisation buffer (~14 s deep) that every poll drains, so a 2 s poll loses
# no GPU detail while halving the cost of redrawing the screen (the same default as nvitop).
DEFAULT_INTERVAL_S = 2.0
# In the interactive UI with no job attached only the slow system checks can fire: the advisor
# then runs this often to keep an idle monitor cheap (an evaluation is ~5-10 ms of CPU).
UI_IDLE_ADVISOR_EVERY_S = 10.0
# The most Python stacks per second taken from an attached job (--sample-rate); the sampler's
# CPU and pause budgets may take fewer (gputop.sources.stacks says why).
DEFAULT_SAMPLE_RATE_HZ = 5.0
# Stopping a recording waits for the next poll of the GPUs and the host (it holds what happened up
# to the stop), at most this long (plus half a second) however long the poll interval.
RECORD_SETTLE_MAX_S = 5.0


@dataclass(frozen=True)
class Config:
    """What a live session watches and how. Every default lives here."""

    interval: float = DEFAULT_INTERVAL_S
    stuck_after: float = DEFAULT_STUCK_AFTER_S
    window: float = DEFAULT_WINDOW_S
    pid: int | None = None
    fake: int | None = None  # N scripted GPUs instead of NVML
    advisor: bool = True
    # Seconds between advisor runs while no job is attached (0: every interval). The verdict does
    # not depend on it (the advisor's hysteresis counts evaluations), only how soon it comes.
    advisor_idle_every: float = 0.0
    sample_rate: float = DEFAULT_SAMPLE_RATE_HZ  # the attached job's stacks per second, at most
    # The Stacks and Ranks panes' views, computed on the pipeline (analysis.views): only the UI
    # shows them, so the headless commands leave them out.
    views: bool = False


class Mode(str, Enum):
    """Where a session's samples come from. A str, so the UI and the recording compare and write
    it as the word ("replay")."""

    LIVE = "live"
    FAKE = "fake"  # scripted GPUs (sources.fake)
    REPLAY = "replay"

    def __str__(self) -> str:
        return self.value


@dataclass
class Session:
    """A running (or about to run) pipeline and the named parts the UI and commands use."""

    store: Store
    pipeline: Pipeline
    mode: Mode = Mode.LIVE
    interval: float = DEFAULT_INTERVAL_S  # seconds between samples (a replay: the recorded one)
    window: float = DEFAULT_WINDOW_S
    stuck_after: float = DEFAULT_STUCK_AFTER_S
    target_pid: int | None = None
    attach_error: str | None = None  # why the target's stacks cannot be sampled
    # A replay of a cut copy: what the cut took of the recorded findings and of the stacks' frames
    # ("lost", "partly"; None: nothing), as ``Reader.lost`` says it, so the UI says it too.
    findings_lost: str | None = None
    frames_lost: str | None = None
    advisor_idle_every: float = 0.0
    gpu: Source | None = None  # NVML or the fake
    host: HostSource | None = None
    stacks: PySpySource | None = None
    procfs: Source | None = None  # the target's threads as /proc shows them (state, CPU, wchan)
    replay: ReplaySource | None = None
    # The one derived stage (advisor.stage): each tick one evidence window, and from it the
    # advisor's verdict (``advisor``: its part, None when off), the stuck watch's events and, in
    # the UI's sessions, the panes' views.
    stage: JobStage | None = None
    advisor: AdvisorSource | None = None
    # One sampler per other local rank of a multi-rank job (``stacks`` samples the target rank).
    rank_stacks: tuple[PySpySource, ...] = ()
    job: Job | None = None  # the multi-rank job attached to, None: one process
    rank_watch: Source | None = None  # finds the job's ranks again: a rank that exits or restarts
    nccl_ras: Source | None = None  # NCCL's RAS report of a multi-rank job (its ranks' collective counts)
    recorder: Recorder | None = None  # while one is attached
    sample_rate: float = DEFAULT_SAMPLE_RATE_HZ
    clock: Callable[[], float] = time.time
    _attach_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closing: set[Recorder] = field(default_factory=set, repr=False)  # recorders being stopped

    # ----------------------------------------------------------------- running

    def start(self) -> None:
        self.pipeline.start()

    def stop(self, until: float | None = None) -> None:
        """Stop collection and close the recording (flushed: one self-contained file); ``until``:
        see ``stop_recording``."""
        self.stop_recording(until)  # while the sources run: their next poll says what happened up to now
        self.pipeline.stop()
        for rec in list(self._closing):  # a stop_recording on another thread (the UI's) not done yet
            rec.close()

    def run_for(self, seconds: float | None, should_stop: Callable[[], str | None] = lambda: None,
                tick: Callable[[float], None] = lambda elapsed: None, every: float = 0.5) -> str | None:
        """Collect until ``seconds`` pass (None: until stopped) or ``should_stop`` gives a reason;
        ``tick(elapsed)`` runs between waits (a progress line). Returns the reason, if any."""
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            if seconds is not None and elapsed >= seconds:
                return None
            why = should_stop()
            if why:
                return why
            tick(elapsed)
            time.sleep(every if seconds is None else min(every, max(0.01, seconds - elapsed)))

    def require_stacks(self, command: str = "advise") -> None:
        """For headless commands whose one question is the target's stacks: raise UserError
        with the reason when they cannot be had (the live UI and `record` go on without them),
        saying what still watches the process's GPUs and host."""
        if self.attach_error is not None:
            self.pipeline.stop()
            pid = self.target_pid
            raise UserError(f"{self.attach_error}; {command} needs the job's stacks: `gputop --pid {pid}` and "
                            f"`gputop record --pid {pid}` still watch its GPUs and the host")

    @property
    def target_state(self) -> TargetState | None:
        """The attached job's state, read once here by the UI and the commands: its sampler's
        reading, or, when no sampler could start, why its stacks cannot be sampled. None when
        nothing is attached (and in a replay, whose recording says how its job ended)."""
        if self.stacks is not None:
            return self.stacks.state
        if self.target_pid is not None and self.attach_error is not None:
            return TargetState(self.target_pid, TargetStatus.UNTRACEABLE, reason=self.attach_error)
        return None

    @property
    def nvlink_bps(self) -> Mapping[int, tuple[float, float]] | None:
        """GPU -> (tx, rx) NVLink bytes/s from the store's latest GPU samples: live and replay
        alike (a recording keeps the rates with the samples); None when no GPU has them."""
        rates = {}
        for i in self.store.gpu_indices():
            s = self.store.latest_gpu(i)
            if s is not None and s.nvlink_tx_bps is not None and s.nvlink_rx_bps is not None:
                rates[i] = (s.nvlink_tx_bps, s.nvlink_rx_bps)
        return rates or None

    @property
    def without_gpus(self) -> bool:
        """No GPU to show: live, no NVML (nor the fake); a replay, a recording that holds none
        (the process table then sorts by CPU, as live without NVML: GPU memory is n/a for all)."""
        if self.replay is not None:
            return not self.replay.reader.gpu_indices()
        return self.gpu is None

    # ----------------------------------------------------------------- verbs for the UI

    def attach(self, pid: int) -> None:
        """Sample ``pid``'s stacks from now on, in place of the current target. Raises UserError
        (with the reason and the fix) when it cannot be done; the session is then unchanged, and
        the failure is published as an event first, through the pipeline, so the status line and
        a running recording both have it."""
        try:
            self._attach(pid)
        except UserError as exc:
            self.pipeline.publish([Event(self.clock(), "attach", f"cannot attach to {pid}: {exc}", "error")])
            raise

    def _attach(self, pid: int) -> None:
        from .sources import check_attachable

        if self.mode is Mode.REPLAY:
            raise UserError("a replay cannot attach to a process")
        with self._attach_lock:
            # A launcher's or a rank's PID: the job's ranks are found now, as at start-up.
            job = _find_job(pid)
            target = pid if job is None or job.given_is_rank else job.ranks[0].pid
            check_attachable(target)
            for src in (self.stacks, *self.rank_stacks):
                if src is not None:
                    self.pipeline.remove_source(src)  # the old target (or job) is not watched any more
            self.stacks, self.rank_stacks = None, ()
            self._sample(target, job)
            self.attach_error = None
            if self.rank_watch is not None and job is None:
                self.pipeline.remove_source(self.rank_watch)
                self.rank_watch = None
            elif self.rank_watch is None and job is not None:
                self.rank_watch = RankWatch(self)
                self.pipeline.add_source(self.rank_watch)
            what = f"process {pid}" if job is None else f"the job of process {pid} ({len(job.ranks)} ranks, rank {_rank_of(job, target)} as target)"
            batch: list[object] = [Event(self.clock(), "attach", f"attached to {what}", "info")]
            if job is not None:
                batch.append(_ranks_event(job, self.clock()))
            self.pipeline.publish(batch)  # through the pipeline: a recording keeps them too

    def _sample(self, target: int, job) -> None:
        """Sample ``target`` (stacks and /proc) and every other rank of ``job``, the sampling
        budget shared among them so the total stays what one process costs. Holds no lock: the
        callers do."""
        from .sources import ATTACH_BURST_RATE, DEFAULT_CPU_BUDGET, DEFAULT_PAUSE_BUDGET, DEFAULT_RATE

        n = len(job.ranks) if job is not None else 1
        # The attach burst is shared too (the ranks together sample as one process would), and
        # a --sample-rate below the default gets none.
        burst = ATTACH_BURST_RATE if self.sample_rate >= DEFAULT_RATE else self.sample_rate
        share = dict(rate=self.sample_rate / n, cpu_budget=DEFAULT_CPU_BUDGET / n, pause_budget=DEFAULT_PAUSE_BUDGET / n,
                     burst_rate=burst / n)
        if self.stacks is None or self.stacks.pid != target:
            if self.stacks is not None:
                self.pipeline.remove_source(self.stacks)
            self.stacks = stack_sampler(target, clock=self.clock, **share)
            self.pipeline.add_source(self.stacks)
        if job is not None:
            keep = {r.pid for r in job.ranks if r.pid != target}  # the target has its own sampler
            for src in self.rank_stacks:
                if src.pid not in keep:
                    self.pipeline.remove_source(src)
            have = {src.pid for src in self.rank_stacks if src.pid in keep}
            added = tuple(stack_sampler(r.pid, clock=self.clock, **share) for r in job.ranks
                          if r.pid != target and r.pid not in have)
            self.rank_stacks = tuple(src for src in self.rank_stacks if src.pid in keep) + added
            for src in added:
                self.pipeline.add_source(src)
        self.job = job
        if job is not None and self.nccl_ras is None:
            self.nccl_ras = nccl_ras_source(target, clock=self.clock)
            if self.nccl_ras is not None:
                self.pipeline.add_source(self.nccl_ras)
        elif job is None and self.nccl_ras is not None:
            self.pipeline.remove_source(self.nccl_ras)
            self.nccl_ras = None
        if self.target_pid != target or self.procfs is None:
            if self.procfs is not None:
                self.pipeline.remove_source(self.procfs)
            self.procfs = procfs_reader(target, clock=self.clock)
            self.pipeline.add_source(self.procfs)
        self.target_pid = target
        if self.host is not None:
            self.host.target_pid = target  # OS details (environment, IO) follow the new target

    def refresh_ranks(self) -> list[object]:
        """Find the attached job's ranks again (the rank watch calls it every few seconds): a rank
        that exited stops being sampled, one that restarted (a new PID for its rank) or joined
        is sampled, and the target follows its rank (else the lowest rank left). Returns the
        events that say so, and the ranks event again whenever the map changed (or the store
        let it go). Never raises for a process that is gone."""
        from .analysis import rank_map

        with self._attach_lock:
            job = self.job
            if job is None:
                return []
            now = self.clock()
            new = _find_job_again(job)
            if new is None:
                self.job = None  # nothing left to follow; the samplers say their own exits
                return [Event(now, "job", "the multi-rank job's ranks have all exited", "warning")]
            old = {r.pid: r.rank for r in job.ranks}
            cur = {r.pid: r.rank for r in new.ranks}
            if old == cur:
                self.job = new
                return [] if rank_map(self.store.events()) == cur else [_ranks_event(new, now)]
            out: list[object] = []
            for pid, rank in sorted(old.items(), key=lambda x: x[1]):
                if pid not in cur:
                    again = next((p for p, r in cur.items() if r == rank), None)
                    out.append(Event(now, "job", f"rank {rank} (pid {pid}) exited"
                                     + (f"; restarted as pid {again}" if again else ""), "warning"))
            for pid, rank in sorted(cur.items(), key=lambda x: x[1]):
                if pid not in old and rank not in old.values():
                    out.append(Event(now, "job", f"rank {rank} (pid {pid}) joined", "info"))
            target = self.target_pid
            if target not in cur:
                rank = old.get(target)
                target = next((p for p, r in cur.items() if r == rank), None) or new.ranks[0].pid
            self._sample(target, new)
            out.append(_ranks_event(new, now))
            return out

    def native_dump(self, pid: int) -> str:
        """py-spy's native (C/C++/CUDA) dump of ``pid``: ~0.6 s, on demand only."""
        from .sources import native_dump

        return native_dump(pid)

    def start_recording(self, path: str | Path, *, force: bool = False, append: bool = False,
                        max_bytes: int | None = None) -> Recorder:
        """Record everything the pipeline carries from now on. Raises UserError (file exists,
        not a recording, cannot write)."""
        from .record import Recorder
        from .record import OutputExists

        if self.recorder is not None:
            raise UserError(f"already recording to {self.recorder.path}")
        first: list[object] = []
        if append and self.gpu is not None and not self.pipeline.running and not self.store.gpu_info:
            # Which GPUs this session watches, before anything is appended (a recording holds one
            # source and one set of GPUs): their first poll, taken now (no source thread runs
            # yet) and published once the recorder listens, so it is recorded too.
            first = list(self.gpu.poll())
        try:
            self.recorder = Recorder.attach(self, Path(path), force=force, append=append, interval=self.interval,
                                            max_bytes=max_bytes, identify=first)
        except OutputExists:
            from .record import looks_like_recording

            if Path(path).is_file() and looks_like_recording(Path(path)) is False:
                # --force is for recordings: it would not write over this either (a new user was
                # told to use it, then refused).
                raise UserError(f"{path} exists and is not a gputop recording: not writing over it; choose another "
                                "name") from None
            raise UserError(f"{path} already exists: use --force to overwrite it, or choose another name") from None
        finally:
            if first:
                self.pipeline.publish(first)
        return self.recorder

    def stop_recording(self, until: float | None = None) -> Recorder | None:
        """Close the recording: first, while collection runs, wait for the sources' next poll
        (at most a poll interval), which holds what happened up to the stop (or up to ``until``,
        an earlier instant on the session's clock: a poll already taken then is enough); then
        flush and close (one self-contained file)."""
        rec, self.recorder = self.recorder, None
        if rec is None:
            return None
        self._closing.add(rec)
        try:
            if self.pipeline.running:
                kinds = [k for k, src in ((GpuSample, self.gpu), (HostSample, self.host)) if src is not None]
                rec.settle(self.clock() if until is None else min(until, self.clock()), kinds, timeout=min(self.interval, RECORD_SETTLE_MAX_S) + 0.5,
                           alive=lambda: self.pipeline.running)
            rec.close()  # flushes the last batch and leaves one self-contained file
        finally:
            self._closing.discard(rec)
        return rec


# --------------------------------------------------------------------------- assembling


def open_live(config: Config = Config(), store: Store | None = None, clock: Callable[[], float] = time.time) -> Session:
    """Sources for this machine (or the fake one), the advisor on top. Raises UserError for a
    ``pid`` that does not exist; a process that cannot be sampled (not Python, no permission)
    leaves ``attach_error`` set and GPU and host monitoring running."""
    from .sources import HostSource

    store = store or Store()
    attach_note: Event | None = None
    pid = config.pid
    job = _find_job(pid) if pid is not None else None
    if job is not None:
        store.add([_ranks_event(job, clock())])
        # The launcher has no training stack: rank 0 stands in for it.
        pid = pid if job.given_is_rank else job.ranks[0].pid
    if pid is not None:
        from .sources import AttachError, check_attachable

        try:
            check_attachable(pid)
        except AttachError as exc:
            if exc.kind == "gone":
                raise
            attach_note = Event(clock(), "stacks", f"cannot sample stacks of PID {pid}: {exc}", "error")
    gpu, notes = _gpu_source(config.interval, config.fake, clock)
    if notes:
        store.add(notes)
    session = Session(
        store=store, pipeline=Pipeline(store, [], clock=clock), mode=Mode.FAKE if config.fake is not None else Mode.LIVE,
        interval=config.interval, window=config.window, stuck_after=config.stuck_after, target_pid=pid,
        attach_error=attach_note.message if attach_note is not None else None,
        advisor_idle_every=config.advisor_idle_every, gpu=gpu, clock=clock, sample_rate=config.sample_rate,
    )

    def rank_pids() -> list[int]:
        job = session.job
        return [r.pid for r in job.ranks] if job is not None else []

    def pids_to_watch() -> list[int]:
        # The host source reads OS details for whatever holds a GPU, plus the target, its ranks
        # and their launcher (the process table leads with the job, its launcher first).
        pids = {p.pid for p in store.gpu_processes()} | set(rank_pids())
        if session.job is not None and session.job.launcher is not None:
            pids.add(session.job.launcher)
        if session.target_pid is not None:
            pids.add(session.target_pid)
        return sorted(pids)

    session.host = HostSource(interval=config.interval, pids=pids_to_watch, clock=clock, target_pid=pid,
                              top_cpu=0 if gpu is not None else 15, env_pids=rank_pids)
    if pid is not None and attach_note is None:
        # Every rank is sampled, the budget shared among them so the total stays what one costs.
        session._sample(pid, job)
        if job is not None:
            session.rank_watch = RankWatch(session)
            session.pipeline.add_source(session.rank_watch)
    elif pid is not None:
        session.procfs = procfs_reader(pid, clock=clock)  # the kernel's view, Python or not
        session.pipeline.add_source(session.procfs)
    if attach_note is not None:
        store.add([attach_note])
    for src in (gpu, session.host):
        if src is not None:
            session.pipeline.add_source(src)
    # The stuck watch's events go through the pipeline like a source's samples, so the UI, the
    # recorder and the exporter all see them.
    _add_stage(session, advise=config.advisor, stuck=True, views=config.views)
    return session


def open_replay(path: str | Path, speed: float = 1.0, start: str | None = None, paused: bool = False,
                advisor: bool = True, views: bool = False) -> Session:
    """A session whose only source is the recording, and the derived stages a live session has:
    the advisor, and with ``views`` the panes' views (as ``Config.views``). Raises UserError for a
    bad file or time."""
    from .record import Navigator
    from .record import Reader
    from .record import ReplaySource, parse_position

    reader = Reader(path)
    try:
        pos = None
        if start:
            try:
                pos = parse_position(start, reader.start_ts, reader.end_ts)
            except ValueError as exc:
                raise UserError(f"--start: {exc}") from None
        store = Store()
        source = ReplaySource(reader, Navigator(reader), speed=speed, start=pos, paused=paused)
        pipeline = Pipeline(store, [source], clock=lambda: source.position)
        source.attach(pipeline.publish)
        last = reader.sessions[-1] if reader.sessions else {}
        # Judged with the threshold and window the recorded session's advisor had, as `report` does.
        judging = reader.judging().get(last.get("id"), {})
        session = Session(store=store, pipeline=pipeline, mode=Mode.REPLAY, interval=last.get("interval") or DEFAULT_INTERVAL_S,
                          target_pid=last.get("target_pid"), replay=source, clock=lambda: source.position,
                          **judging)
        if session.target_pid is not None and reader.lost("stacks") == "lost":
            # A cut copy that ends before its stacks: none will come, so the panes say so rather
            # than "collecting evidence: 0 of ~20 stacks" for the whole replay.
            session.attach_error = "the recording's stacks were lost (the file is cut before them)"
        session.findings_lost, session.frames_lost = reader.lost("findings"), reader.lost("frames")
    except BaseException:
        reader.close()
        raise
    if advisor or views:
        # No stuck watch: the recording holds the events it made.
        _add_stage(session, advise=advisor, stuck=False, views=views)
    return session


# How often the attached job's ranks are looked for again. Judgement: a rank's restart is seen
# within a few seconds, and one look (the launcher's children and their environments) costs
# well under a millisecond per rank.
RANK_WATCH_S = 5.0


class RankWatch:
    """A derived stage that keeps a multi-rank session's ranks current (``Session.refresh_ranks``)."""

    name = "ranks"

    def __init__(self, session: Session, interval: float = RANK_WATCH_S) -> None:
        self.session = session
        self.interval = interval
        self._first = True

    def poll(self) -> list[object]:
        if self._first:  # the session named the ranks as it attached
            self._first = False
            return []
        return self.session.refresh_ranks()

    def close(self) -> None:
        pass


def _find_job(pid: int):
    """``pid``'s multi-rank job (sources.ranks.Job: the launcher and every local rank), None when
    ``pid`` is one process."""
    from .sources import find_ranks

    return find_ranks(pid)


def _find_job_again(job):
    """The job as it is now, looked for from its launcher, else from any rank still there."""
    for pid in ([job.launcher] if job.launcher else []) + [r.pid for r in job.ranks]:
        found = _find_job(pid)
        if found is not None:
            return found
    return None


def _rank_of(job, pid: int) -> int | None:
    return next((r.rank for r in job.ranks if r.pid == pid), None)


def _ranks_event(job, ts: float) -> Event:
    """The event that names every rank: ``analysis.ranks`` reads it back, live and in a recording."""
    from .analysis import ranks_message

    return Event(ts, "ranks", ranks_message({r.pid: r.rank for r in job.ranks}, job.launcher), "info")


def _add_stage(session: Session, *, advise: bool, stuck: bool, views: bool) -> None:
    """The one derived stage (advisor.stage.JobStage): the advisor, the stuck watch and, for the UI
    (``views``), the Stacks and Ranks panes' views, all from one evidence window a tick, computed
    on the pipeline's thread and published through the store, live and in a replay alike, never on
    the UI's event loop. It follows the session's target and uses its window and stuck threshold."""
    from .advisor import add_job_stage

    session.stage = add_job_stage(session, advise=advise, stuck=stuck, views=views)
    session.advisor = session.stage.advisor


def _gpu_source(interval: float, fake: int | None, clock) -> tuple[Source | None, list[object]]:
    """The GPU source, or None with a SystemInfo saying why NVML is unavailable."""
    if fake is not None:
        from .sources import FakeGpuSource

        return FakeGpuSource(gpus=fake, interval=interval, clock=clock), []
    from .sources import NvmlSource, NvmlUnavailable

    try:
        return NvmlSource.open(interval=interval, clock=clock), []
    except NvmlUnavailable as exc:
        info = SystemInfo(ts=clock(), hostname=socket.gethostname(), nvml_error=str(exc), source="live")
        return None, [info, Event(info.ts, "nvml", f"NVML unavailable: {exc}", "warning")]


def procfs_reader(pid: int, **options) -> Source:
    """/proc readings of ``pid`` and its children (threads' states, CPU time, wchan): the
    kernel's evidence that lets the stuck verdict come at attach."""
    from .sources import ProcfsSource

    return ProcfsSource(pid, **options)


# How often NCCL's RAS service is asked for its report. Judgement: each query makes the job's RAS
# threads gather every rank's counts (a few KB on the job's own network); every 5 s tells a
# hang (counts frozen for HANG_MIN_FROZEN_S) within the stuck verdict's own reach.
RAS_EVERY_S = RAS_POLL_S  # analysis.nccl_ras reads a standing report by it


def nccl_ras_source(pid: int, **options) -> Source | None:
    """A source of NCCL's RAS reports for the job whose rank is ``pid`` (the address from the
    rank's environment), None when the rank runs none (NCCL_RAS_ENABLE=0)."""
    from .sources import NcclRasSource, environ_of

    return NcclRasSource.for_environment(environ_of(pid), interval=RAS_EVERY_S, **options)


def gpu_processes_now() -> tuple[bool, list]:
    """Whether NVML reads GPUs here, and the processes it lists on them (one poll): for a one-shot
    command that must tell a rank training on a GPU from one on the CPU (``gputop stacks``)."""
    from .model import GpuProcess
    from .sources import NvmlSource, NvmlUnavailable

    try:
        src = NvmlSource.open()
    except NvmlUnavailable:
        return False, []
    try:
        return True, [o for o in src.poll() if isinstance(o, GpuProcess)]
    finally:
        src.close()


def stack_sampler(pid: int, **options) -> PySpySource:
    """py-spy on ``pid``, classifying stacks with the analysis layer's classifier (a source
    decides nothing itself). ``gputop stacks`` uses it for its one-shot dump."""
    from .analysis import classify_stack, is_library
    from .sources import PySpySource

    return PySpySource(pid, classify=classify_stack, is_library=is_library, **options)


