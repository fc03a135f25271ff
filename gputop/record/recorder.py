"""Recording a session: ``Recorder``, the pipeline subscriber that hands batches to a
``RecordWriter`` on a thread of its own.

The pipeline calls ``Recorder.on_batch`` on its source threads; that only queues the batch. A
writer thread drains the queue and commits every ``FLUSH_INTERVAL_S``, so neither a source nor
the UI ever waits on the disk, and a killed recorder loses at most the last flush.

Wiring it to a running session (the UI's ``--record FILE`` and its record key)::

    rec = Recorder.attach(session, path, force=False, interval=args.interval)  # UserError if bad
    ...
    rec.close()  # unsubscribes, writes what is queued, closes the file

or by hand: ``Recorder.open(path, store=..., notify=pipeline.publish)`` then
``pipeline.subscribe(rec.on_batch)``.

``notify`` receives a one-element batch with an ``Event`` when recording stops on its own (disk
full, I/O error): monitoring goes on, the file keeps what was committed.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import UserError
from ..model import (Event, Finding, GpuInfo, GpuProcess, GpuSample, HostSample, PaneViews, ProcSample, Reset,
                     SamplingCost, StackSample, SystemInfo, TaskSample, UtilPoint, Verdict)
from ..redact import redact_cmdline
from ..units import fmt_clock, fmt_size_limit
from .schema import STATE_EVENT_SOURCES
from .files import sidecars
from .writer import Identity, RecordWriter, SessionMeta, describe_sqlite_error

if TYPE_CHECKING:
    from ..session import Session

# Commit cadence. The crash-safety budget is ~1 s lost on SIGKILL; half a second leaves
# room for a slow commit. Each commit is one WAL append (fsync-free at synchronous=NORMAL).
FLUSH_INTERVAL_S = 0.5
# Batches waiting for the writer before new ones are dropped (and counted): at default rates a
# session produces ~7 batches a second, so this is about five minutes of a stalled disk.
MAX_PENDING_BATCHES = 2000

# What carries its own time, so a stop time cuts it (every model type with a `ts`; a test keeps
# the list whole): the rest (the target's state) is kept whatever its moment.
TIMED = (Event, Finding, GpuInfo, GpuProcess, GpuSample, HostSample, PaneViews, ProcSample, Reset, SamplingCost,
         StackSample, SystemInfo, TaskSample, UtilPoint, Verdict)

_STOP = object()

Notify = Callable[[Sequence[object]], None]

# One sample of each is taken per poll of the GPUs and of the host: what ``Recorder.settle`` waits
# for.
POLLS = (GpuSample, HostSample)


def target_cmdline(pid: int | None) -> str:
    """The target's command line, redacted (empty when it cannot be read)."""
    if pid is None:
        return ""
    try:
        import psutil

        return redact_cmdline(psutil.Process(pid).cmdline())
    except Exception:
        return ""


# --------------------------------------------------------------------------- the subscriber


def _state_of(store) -> list[object]:
    """What a recording started mid-session must begin with: the static info sources send once,
    the state events, and the advisor's current verdict (the findings showing now)."""
    seed: list[object] = []
    if store.system is not None:
        seed.append(store.system)
    seed.extend(store.gpu_info.values())
    # The newest rank map and GPU topology: said once when the session attached, before
    # this recording may have started (a replay and the report read the ranks back).
    events = store.events()
    for source in STATE_EVENT_SOURCES:
        seed.extend([e for e in events if e.source == source][-1:])
    # The advisor sends a finding when it appears or changes (and every RECORD_REFRESH_S): one
    # already showing would otherwise be missing until then, or for good in a short recording.
    # Stamped with the recording's start; ``first_seen`` stays when the advisor first showed it,
    # as in every row it sends later.
    now = store.now
    seed.extend(replace(f, ts=max(f.ts, now)) for f in store.findings())
    return seed


class Recorder:
    """A pipeline subscriber that records every batch to a file, off the caller's thread."""

    def __init__(
        self,
        writer: RecordWriter,
        notify: Notify | None = None,
        flush_interval: float = FLUSH_INTERVAL_S,
        max_pending: int = MAX_PENDING_BATCHES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.writer = writer
        self.path = writer.path
        self.notify = notify
        self.flush_interval = flush_interval
        self.clock = clock
        self.error: str | None = None
        # Set when the --max-size cap stopped the recording and the file was closed cleanly: an
        # end the user asked for, not an error.
        self.capped: str | None = None
        self.dropped = 0  # samples dropped because the writer fell behind
        self.started = time.monotonic()
        self._q: queue.Queue = queue.Queue(maxsize=max_pending)
        self._active = True
        self._closed = False
        self._unsubscribe: Callable[[], None] | None = None
        self._polled: dict[type, float] = {}  # the newest poll of each kind queued (``settle``)
        # Nothing stamped after this is written (``end_at``): a recording of a set length.
        self._until: float | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="gputop-recorder", daemon=True)
        self._thread.start()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        force: bool = False,
        append: bool = False,
        *,
        store=None,
        notify: Notify | None = None,
        meta: SessionMeta | None = None,
        max_bytes: int | None = None,
        flush_interval: float = FLUSH_INTERVAL_S,
        identify: Sequence[object] = (),
    ) -> "Recorder":
        """Create (or append to) ``path`` and start the writer thread. Raises UserError.

        ``store``: a running session's store; its static info (SystemInfo, GpuInfo), which
        sources send only once, and the findings showing now are written first so a recording
        started mid-session is complete.
        """
        seed = _state_of(store) if store is not None else []
        # Appending: the session must watch what the recording watched (``identify``: the
        # session's static info not in the store yet, e.g. from a first poll not published yet).
        identity = Identity.of([*seed, *identify]) if append else None
        writer = RecordWriter.create(path, force=force, append=append, max_bytes=max_bytes, identity=identity)
        try:
            writer.start_session(meta or SessionMeta(argv=tuple(sys.argv)))
        except sqlite3.Error as exc:
            writer.abort()
            raise UserError(f"cannot write {path}: {describe_sqlite_error(exc, max_bytes)}") from None
        rec = cls(writer, notify=notify, flush_interval=flush_interval)
        if seed:
            rec.on_batch(seed)
        return rec

    @classmethod
    def attach(
        cls,
        session: Session,
        path: str | os.PathLike,
        force: bool = False,
        append: bool = False,
        *,
        interval: float | None = None,
        max_bytes: int | None = None,
        argv: Sequence[str] | None = None,
        identify: Sequence[object] = (),
    ) -> "Recorder":
        """Record a running (or about to run) session: the UI's --record and its record key.

        Writes the session's static info first, subscribes to its pipeline, and reports a
        failure (disk full) through it as an Event. ``close()`` unsubscribes and closes.
        """
        meta = SessionMeta(
            mode=str(session.mode),
            argv=tuple(sys.argv if argv is None else argv),
            target_pid=session.target_pid,
            target_cmdline=target_cmdline(session.target_pid),
            interval=interval,
            stuck_after=session.stuck_after,
            window=session.window,
        )
        rec = cls.open(path, force=force, append=append, store=session.store, notify=session.pipeline.publish,
                       meta=meta, max_bytes=max_bytes, identify=identify)
        rec._unsubscribe = session.pipeline.subscribe(rec.on_batch)
        return rec

    # ----------------------------------------------------------------- subscriber side

    @property
    def active(self) -> bool:
        return self._active

    def on_batch(self, batch: Sequence[object]) -> None:
        """Queue a batch; never blocks, never raises."""
        if not self._active or not batch:
            return
        try:
            self._q.put_nowait(list(batch))
        except queue.Full:
            self.dropped += len(batch)
            return
        for s in batch:  # after queueing: whoever `settle`s on it finds it queued
            if isinstance(s, POLLS):
                k = type(s)
                if s.ts > self._polled.get(k, float("-inf")):
                    self._polled[k] = s.ts

    def settle(self, since: float, kinds: Sequence[type] = POLLS, timeout: float = 2.5,
               alive: Callable[[], bool] = lambda: True) -> bool:
        """Wait until a poll of each of ``kinds`` taken at or after ``since`` is queued (at most
        ``timeout`` seconds, and only while ``alive()``): stopping then keeps what happened up to
        the stop, which the sources only report at their next poll (NVML's utilisation buffer,
        the host's rates). True when it came."""
        deadline = time.monotonic() + timeout
        while True:
            if all(self._polled.get(k, float("-inf")) >= since for k in kinds):
                return True
            if not self._active or not alive() or time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def end_at(self, until: float) -> None:
        """Write nothing stamped after ``until`` (session clock): the recording ends there.

        For a recording asked to last a set time (``record --duration``). Stopping still waits
        for the sources' next poll (``settle``), whose utilisation points up to ``until`` are
        kept; the poll's own samples, taken after it, are not: they would stretch the recording
        by up to a poll interval (``--duration 1s`` at 2 s polls recorded 2 s)."""
        self._until = until

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, close the file. Idempotent; a second caller waits for the first."""
        with self._lock:
            first = not self._closed
            self._closed = True
        if first:
            if self._unsubscribe is not None:
                self._unsubscribe()
            if self._thread.is_alive():
                try:
                    self._q.put(_STOP, timeout=timeout)
                except queue.Full:
                    pass
        self._thread.join(timeout)
        self._active = False

    # ----------------------------------------------------------------- status

    @property
    def samples(self) -> int:
        return self.writer.samples

    def bytes_on_disk(self) -> int:
        total = 0
        for p in (self.path, *sidecars(self.path)):
            try:
                total += os.path.getsize(p)
            except OSError:
                pass
        return total

    # ----------------------------------------------------------------- writer thread

    def _run(self) -> None:
        pending: list[object] = []
        next_flush = time.monotonic() + self.flush_interval
        stop = False
        while not stop:
            try:
                item = self._q.get(timeout=max(0.0, next_flush - time.monotonic()))
            except queue.Empty:
                item = None
            while item is not None:
                if item is _STOP:
                    stop = True
                    break
                if self._active:
                    pending.extend(item)
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    item = None
            if stop or time.monotonic() >= next_flush:
                if pending and self._active:
                    self._flush(pending)
                pending = []
                next_flush = time.monotonic() + self.flush_interval
        if self._active:
            try:
                self.writer.finish()
            except sqlite3.Error as exc:
                self._fail(exc)
        else:
            self.writer.abort()

    def _flush(self, samples: list[object]) -> None:
        until = self._until
        if until is not None:
            samples = [x for x in samples if not (isinstance(x, TIMED) and x.ts > until)]
            if not samples:
                return
        if self.writer.max_bytes and self.writer.near_cap():
            self._stop_at_cap()
            return
        try:
            self.writer.flush(samples)
        except sqlite3.Error as exc:
            self._fail(exc)
        except Exception as exc:  # a sample we cannot encode must not kill the recorder silently
            self._fail(exc)

    def _stop_at_cap(self) -> None:
        """The --max-size cap is reached: close the file cleanly with what it holds."""
        if not self._active:
            return
        upto = self.writer.last_ts
        when = fmt_clock(upto) if upto else "the start"
        try:
            self.writer.finish_at_cap()
            closed = True
        except sqlite3.Error:
            self.writer.abort()
            closed = False
        msg = (f"recording to {self.path} stopped: the --max-size limit of {fmt_size_limit(self.writer.max_bytes)} "
               f"reached; the file keeps data up to {when}")
        if closed:
            self.capped = msg
        else:
            self.error = msg + " (it could not be closed cleanly)"
        if self.notify is not None:
            try:
                self.notify([Event(self.clock(), "record", (self.error or msg) + "; monitoring continues",
                                   "warning" if closed else "error")])
            except Exception:
                pass
        self._active = False

    def _fail(self, exc: BaseException) -> None:
        if not self._active or self.error is not None:
            return
        if isinstance(exc, sqlite3.Error) and self.writer.cap_reached():
            self._stop_at_cap()
            return
        reason = (describe_sqlite_error(exc, self.writer.max_bytes, self.writer.cap_reached())
                  if isinstance(exc, sqlite3.Error) else f"{type(exc).__name__}: {exc}")
        upto = self.writer.last_ts
        when = fmt_clock(upto) if upto else "the start"
        self.error = f"recording to {self.path} stopped: {reason}; the file keeps data up to {when}"
        self.writer.abort()
        if self.notify is not None:
            try:
                self.notify([Event(self.clock(), "record", self.error + "; monitoring continues", "error")])
            except Exception:
                pass
        # Last: whoever waits for `active` to drop sees the error and the event already out.
        self._active = False


__all__ = ["FLUSH_INTERVAL_S", "Recorder"]
