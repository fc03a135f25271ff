"""Writing a recording: ``RecordWriter``, one SQLite connection used from one thread at a time.

It creates the file (or appends to one, refusing a file that is not a recording or that watched
other GPUs), writes each batch's samples into time blocks, the findings as they change and the
overview, merges finished minutes, and closes the file self-contained. ``recorder.Recorder`` runs
it off the pipeline's threads.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .. import __version__
from ..advisor import advisor_fingerprint
from ..errors import UserError, os_reason
from ..model import (
    Event,
    Finding,
    Frame,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    PaneViews,
    ProcSample,
    StackSample,
    TaskSample,
    Reset,
    SystemInfo,
    UtilPoint,
    Verdict,
)
from ..redact import redact_argv, redact_cmdline, redact_code
from ..units import fmt_size_limit
from . import codec
from .blocks import CODEC_JSON, pack_rows, pack_rows_json, unpack_rows
from .files import looks_like_recording, sidecars
from .overview import OverviewBuilder, OverviewRow
from .sessions import Target, target_change
from .span import Span, recording_span
from .schema import (
    APPENDABLE_VERSIONS,
    FRAMES_KEEPS,
    APPLICATION_ID,
    advisor_key,
    judging_key,
    open_session_key,
    DDL,
    FORMAT_NAME,
    BLOCK_S,
    FLUSH_BLOCK_MAX_S,
    MAX_BLOCK_SPAN_S,
    SCHEMA_VERSION,
    SERIES,
    pack_ids,
    series_layouts,
    series_tables_if_missing,
)

# A minute is merged once no sample for it can still arrive: NVML's buffer is read once per
# poll, so its entries can lag the newest sample by a poll interval and a slow poll.
COMPACT_SETTLE_S = 5.0
# SQLite's default page. Every commit appends the pages it touched (a leaf per series, ~6) to
# the WAL: 8 KiB pages made files ~10 % smaller in the benchmark but doubled those writes
# (~100 KB/s at two commits a second), a poor trade for a monitor that runs for days.
PAGE_SIZE = 4096
# The session row's end time is rewritten this often (not every flush: one page less per
# commit); readers compare it with the data to tell a truncated file.
SESSION_END_EVERY_S = 5.0
# The WAL is folded into the main file this often (a passive checkpoint after a commit), so the
# main file alone, copied or left behind by a killed recorder, is never more than this behind.
CHECKPOINT_EVERY_S = 5.0
# Merging is spread out: after a long stall, at most this many minutes per table per flush.
MAX_COMPACT_PER_FLUSH = 4

# Derived state is not recorded: a replay derives the advisor's verdicts and the panes' views
# again from the samples (the findings are recorded as they change); a reset only ever comes from
# a replay.
NOT_RECORDED = (Verdict, PaneViews, Reset)
# The samples that start a recording's span (record.span): recorded as they happened. Utilisation
# points may be the buffer's history from before; static info and findings are state, not time.
_AS_IT_HAPPENED = (GpuSample, GpuProcess, HostSample, ProcSample, StackSample, Event)


class OutputExists(UserError):
    """The output file exists and neither overwriting nor appending was asked for."""


@dataclass(frozen=True)
class SessionMeta:
    """What a session row says about how the recording was made. Redacted when written."""

    mode: str = "live"  # live | fake | replay
    argv: tuple[str, ...] = ()
    target_pid: int | None = None
    target_cmdline: str = ""
    interval: float | None = None
    host: str = field(default_factory=socket.gethostname)
    stuck_after: float | None = None  # the advisor's stuck threshold (s)
    window: float | None = None  # the advisor's window (s)


# --------------------------------------------------------------------------- creating the file


def _create_exclusive(path: Path) -> None:
    """Create the file 0600 before SQLite sees it; fail if anything is already there."""
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise OutputExists(f"{path} already exists: use --force to overwrite it or --append to add to it") from None
    except OSError as exc:
        # In gputop's words: "/proc does not take new files", "t.txt is not a directory".
        raise UserError(f"cannot create {path}: {os_reason(exc, path)}") from None
    os.close(fd)


# --------------------------------------------------------------------------- one writer at a time
#
# A recorder holds an exclusive flock on its file for as long as it writes: a second `record
# --force` would otherwise delete the file under it (the first recorder's data gone, and it then
# said the file "keeps data up to" a time it no longer held), and a second `--append` would add a
# session that took over the first recorder's samples. Readers (replay, report, info) take no
# lock: they read a live recording as before. flock, not SQLite's own locks: those are held only
# while a transaction runs.


def _lock_pid(path: Path) -> int | None:
    """The process holding a flock on ``path`` (/proc/locks), None when not found."""
    try:
        ino = os.stat(path).st_ino
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:56789 0 EOF"
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(ino):
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


def _lock_for_writing(path: Path, doing: str) -> int:
    """An fd of ``path`` holding its exclusive flock; UserError while another recorder holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise UserError(f"cannot {doing} {path}: {os_reason(exc)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid = _lock_pid(path)
        by = f" (pid {pid})" if pid is not None else ""
        raise UserError(f"cannot {doing} {path}: another gputop{by} is recording to it; "
                        "stop that recording first, or record to a new file") from None
    except OSError:
        pass  # a file system without flock: no guard, as before
    return fd


def _release(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)  # closing the last fd of the open file releases its flock
        except OSError:
            pass


def _remove_existing(path: Path) -> None:
    """``--force``: replace an old recording, never an unrelated file, never one being written."""
    if path.is_symlink() or not path.exists():
        if path.is_symlink():
            raise UserError(f"{path} is a symbolic link: not overwriting it")
        return
    if not path.is_file():
        raise UserError(f"{path} exists and is not a regular file")
    kind = looks_like_recording(path)
    if kind is False:
        raise UserError(f"{path} exists and is not a gputop recording: not overwriting it")
    _release(_lock_for_writing(path, "overwrite"))
    for p in (path, *sidecars(path)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise UserError(f"cannot remove {p}: {os_reason(exc)}") from None


def _chmod_private(path: Path) -> None:
    # SQLite gives -wal/-shm the database's mode; this makes sure of it.
    for p in sidecars(path):
        try:
            os.chmod(p, 0o600)
        except OSError:
            pass


def _closing_reserve(cap_pages: int) -> int:
    """Pages kept for closing a capped recording: 2 % of the cap, at least 64 (256 KB with 4 KB
    pages); a second of 8 GPUs' samples with stacks takes a few dozen."""
    return max(64, cap_pages // 50)


def describe_sqlite_error(exc: BaseException, max_bytes: int | None = None, cap_reached: bool | None = None) -> str:
    """One line for a failed write. ``max_bytes``: the --max-size cap, when one was given (SQLite
    reports a full disk and a reached page cap alike); ``cap_reached``: whether the file had grown
    to the cap (``RecordWriter.cap_reached``), None when unknown: then both are named."""
    code = getattr(exc, "sqlite_errorcode", None)
    msg = str(exc)
    if code == 13 or "full" in msg:  # SQLITE_FULL
        if max_bytes and cap_reached:
            return f"the --max-size limit of {fmt_size_limit(max_bytes)} reached"
        if max_bytes and cap_reached is None:
            return f"disk full (or the --max-size limit of {fmt_size_limit(max_bytes)} reached)"
        return "disk full"
    if code is not None and code & 0xFF == 10 or "I/O" in msg:  # SQLITE_IOERR
        return f"disk I/O error ({msg})"
    return msg


# --------------------------------------------------------------------------- what a session watched

# The GPU source a session used, as ``SystemInfo`` says it: one recording holds one kind, so an
# appended session cannot turn a real recording into a fake one (or a GPU one into a CPU-only one).
SOURCE_LABELS = {"nvml": "real GPUs (NVML)", "fake": "the fake GPU source (--fake)", "none": "no GPU (CPU only)"}


def source_kind(system: SystemInfo | None) -> str | None:
    """``nvml``, ``fake`` or ``none`` (NVML unavailable), None when not known yet."""
    if system is None:
        return None
    if system.source == "fake":
        return "fake"
    if system.source == "replay":
        return "replay"
    return "none" if system.nvml_error else "nvml"


@dataclass(frozen=True)
class Identity:
    """What a session watched: its GPU source kind and its GPUs' UUIDs (empty: none, or not known)."""

    kind: str | None
    uuids: frozenset[str] = frozenset()

    @classmethod
    def of(cls, samples: Iterable[object]) -> "Identity":
        """From the static info among ``samples`` (the later ones win)."""
        system = None
        gpus: dict[int, str] = {}
        for s in samples:
            if isinstance(s, SystemInfo):
                system = s
            elif isinstance(s, GpuInfo) and s.uuid:
                gpus[s.index] = s.uuid
        return cls(source_kind(system), frozenset(gpus.values()))

    def refuses(self, new: "Identity") -> str | None:
        """Why a session watching ``new`` must not be appended to a recording of this one."""
        if self.kind is not None and new.kind is not None and self.kind != new.kind:
            return (f"it was recorded from {SOURCE_LABELS.get(self.kind, self.kind)}, this session watches "
                    f"{SOURCE_LABELS.get(new.kind, new.kind)}")
        if self.uuids and new.uuids and self.uuids != new.uuids:
            return (f"it holds GPUs {', '.join(sorted(self.uuids))}, this session watches "
                    f"{', '.join(sorted(new.uuids))}")
        return None


# --------------------------------------------------------------------------- writer


class RecordWriter:
    """Synchronous writer: one connection, used from one thread at a time."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self._lock: int | None = None  # the fd holding the file's flock while this writes
        self.session_id: int | None = None
        # What this session follows, and what the file's last session before it followed (None:
        # a new file): an append of another process is said (``target_change``).
        self.target: Target = (None, None)
        self.previous_target: Target | None = None
        self._frames: dict[Frame, int] = {}
        self._stacks_by_frames: dict[tuple[Frame, ...], int] = {}
        self._stacks_by_ids: dict[bytes, int] = {}
        self._threads: dict[tuple, int] = {}
        self._procs: dict[tuple, int] = {}
        self._strings: dict[str, int] = {}
        self._findings: dict[tuple, tuple[int, tuple]] = {}
        # Whether `findings` has gain_predicted: a new file always; an appended one as it was made.
        self._gain_col = True
        # Each series' block layout: this version's in a new file; an appended file's own (a
        # version 1 file gets GPU rows without the NVLink rates, and stays readable by the
        # gputop that wrote it).
        self._layouts = series_layouts(SCHEMA_VERSION)
        self._last_info: dict[object, str] = {}
        self._overview = OverviewBuilder()
        self._compacted_to: dict[str, float] = {}
        self._ended_written = float("-inf")
        self.samples = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        # This session's span as the reader will compute it (record.span): the first sample
        # recorded as it happened (not the utilisation buffer's history, nor static info or
        # findings) to the last sample of any series.
        self._recorded_first: float | None = None
        self._util_first: float | None = None
        self._series_last: float | None = None
        self.gpus: set[int] = set()
        self.max_bytes: int | None = None
        self.checkpoint_every_s = CHECKPOINT_EVERY_S
        self._checkpointed = time.monotonic()

    # ----------------------------------------------------------------- opening

    @classmethod
    def create(
        cls, path: str | os.PathLike, force: bool = False, append: bool = False, max_bytes: int | None = None,
        identity: Identity | None = None,
    ) -> "RecordWriter":
        """``identity``: what the session to be written watches; appending to a recording of
        another source kind or another set of GPUs is refused (UserError), the file untouched."""
        path = Path(path)
        if append and path.exists():
            return cls._open_append(path, max_bytes, identity)
        if force:
            _remove_existing(path)
        elif path.exists() or path.is_symlink():
            raise OutputExists(f"{path} already exists: use --force to overwrite it or --append to add to it")
        for p in sidecars(path):
            # A -wal left by a deleted recording would be replayed into the new file.
            if p.exists() and not path.exists():
                try:
                    p.unlink()
                except OSError as exc:
                    raise UserError(f"cannot remove stale {p}: {os_reason(exc)}") from None
        _create_exclusive(path)
        lock = _lock_for_writing(path, "record to")
        try:
            conn = _connect(path)
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            # The schema, the marks and the metadata are committed with a rollback journal,
            # straight into the main file, before WAL is switched on: from its first page the
            # file says what it is, even if the recorder is killed before its first checkpoint
            # or only the main file is copied.
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.execute("BEGIN")
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            for stmt in DDL.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?)",
                [
                    ("format", FORMAT_NAME),
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("created_at", repr(time.time())),
                    ("created_by", f"gputop {__version__}"),
                ],
            )
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            for p in (path, Path(f"{path}-journal"), *sidecars(path)):  # not a half-made recording left behind
                try:
                    p.unlink()
                except OSError:
                    pass
            _release(lock)
            raise UserError(f"cannot create {path}: {describe_sqlite_error(exc, max_bytes)}") from None
        _chmod_private(path)
        w = cls(conn, path)
        w._lock = lock
        w._set_max_bytes(max_bytes)
        return w

    @classmethod
    def _open_append(cls, path: Path, max_bytes: int | None, identity: Identity | None = None) -> "RecordWriter":
        if looks_like_recording(path) is not True:
            raise UserError(f"cannot append to {path}: not a gputop recording")
        lock = _lock_for_writing(path, "append to")
        try:
            w = cls._append_locked(path, max_bytes, identity)
        except BaseException:
            _release(lock)
            raise
        w._lock = lock
        return w

    @classmethod
    def _append_locked(cls, path: Path, max_bytes: int | None, identity: Identity | None) -> "RecordWriter":
        try:
            conn = _connect(path)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in APPENDABLE_VERSIONS:
                conn.close()
                raise UserError(
                    f"cannot append to {path}: it has schema version {version}, this gputop writes {SCHEMA_VERSION}"
                )
            if identity is not None:
                # Before anything is written (the journal mode included): a refusal leaves the file as it was.
                why = _recorded_identity(conn).refuses(identity)
                if why is not None:
                    conn.close()
                    raise UserError(f"cannot append to {path}: {why}; record to a new file")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            for stmt in series_tables_if_missing():
                conn.execute(stmt)
        except sqlite3.Error as exc:
            raise UserError(f"cannot append to {path}: {describe_sqlite_error(exc, max_bytes)}") from None
        w = cls(conn, path)
        w._layouts = series_layouts(version)
        try:
            w._load_caches()
        except sqlite3.Error as exc:
            conn.close()
            raise UserError(f"cannot append to {path}: {describe_sqlite_error(exc, max_bytes)}") from None
        # The file itself too: one copied or chmod-ed open (0644) kept its mode while new command
        # lines and stacks were appended to it (a new user's report). Every recording is private.
        try:
            os.chmod(path, 0o600)
        except OSError:
            pass
        _chmod_private(path)
        w._set_max_bytes(max_bytes)
        return w

    def _set_max_bytes(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes or None
        if max_bytes:
            page = self.conn.execute("PRAGMA page_size").fetchone()[0]
            self.conn.execute(f"PRAGMA max_page_count={max(1, int(max_bytes) // page)}")

    def near_cap(self) -> bool:
        """Whether the file is within its closing reserve of the --max-size cap: time to stop
        taking samples and close it cleanly while closing still fits."""
        pages = self._pages() if self.max_bytes else None
        return pages is not None and pages[1] - pages[0] <= _closing_reserve(pages[1])

    def _pages(self) -> tuple[int, int] | None:
        """(pages used, the cap in pages), None when unreadable."""
        try:
            return (self.conn.execute("PRAGMA page_count").fetchone()[0],
                    self.conn.execute("PRAGMA max_page_count").fetchone()[0])
        except sqlite3.Error:
            return None

    def finish_at_cap(self) -> None:
        """Close a recording stopped by its --max-size cap, cleanly: closing writes the pending
        overview, the session's end and the last minute's merge, which may need pages past the
        cap; the file may end up to one reserve (2 %, at least 256 KB) over it rather than be left
        open, which readers take for a recording that was killed."""
        try:
            cap = self.conn.execute("PRAGMA max_page_count").fetchone()[0]
            self.conn.execute(f"PRAGMA max_page_count={cap + _closing_reserve(cap)}")
        except sqlite3.Error:
            pass
        self.finish()

    def cap_reached(self) -> bool | None:
        """After a write failed for want of space with a --max-size cap: whether the file had
        grown to the cap (else the disk is what is full). None: no cap, or unreadable. The cap is
        SQLite's max_page_count; a failed batch needed at most a few dozen pages more, so a file
        within 1 % (at least 64 pages) of it is at the cap: a full disk stops it far below."""
        pages = self._pages() if self.max_bytes else None
        if pages is None:
            return None
        used, cap = pages
        return cap - used <= max(64, cap // 100)

    def _load_caches(self) -> None:
        c = self.conn
        # An --append to a file from before findings.gain_predicted (same schema version, see
        # schema.SCHEMA_VERSION) writes its findings without it rather than adding the column:
        # the report says per file whether gain_predicted was recorded (the column's presence),
        # and an ALTER TABLE would make the earlier sessions' findings read as "recorded, no
        # claim" (NULL) where nothing was recorded. Start a new file to keep the bound.
        self._gain_col = any(r[1] == "gain_predicted" for r in c.execute("PRAGMA table_info(findings)"))
        # A file from before frames.keeps (schema.FRAMES_KEEPS) gets the column: its earlier
        # frames read none, which is what was known of their loops.
        if not any(r[1] == FRAMES_KEEPS for r in c.execute("PRAGMA table_info(frames)")):
            c.execute(f"ALTER TABLE frames ADD COLUMN {FRAMES_KEEPS} TEXT")
        for fid, name, filename, line, module, code, keeps in c.execute(
            "SELECT id, name, filename, line, module, code, keeps FROM frames"
        ):
            self._frames[Frame(name, filename, line, module, code, **codec.loop_fields(keeps))] = fid
        for sid, blob in c.execute("SELECT id, frames FROM stacks"):
            self._stacks_by_ids[bytes(blob)] = sid
        for tid, pid, thread_id, name, is_main, os_tid in c.execute(
            "SELECT id, pid, thread_id, thread_name, is_main, os_thread_id FROM threads"
        ):
            self._threads[(pid, thread_id, name, bool(is_main), os_tid)] = tid
        for row in c.execute("SELECT id, pid, ppid, name, user, cmdline, create_time, role, env FROM processes"):
            self._procs[tuple(row[1:])] = row[0]
        for sid, text in c.execute("SELECT id, text FROM strings"):
            self._strings[text] = sid

    def start_session(self, meta: SessionMeta) -> int:
        argv = " ".join(redact_argv(list(meta.argv))) if meta.argv else None
        cmd = redact_cmdline(meta.target_cmdline.split(" ")) if meta.target_cmdline else None
        last = self.conn.execute("SELECT target_pid, target_cmdline FROM sessions ORDER BY id DESC LIMIT 1").fetchone()
        if last is not None:
            before = codec.opt_text(last[1])
            self.previous_target = (codec.inum(last[0]), redact_cmdline(before.split(" ")) if before else None)
        self.target = (meta.target_pid, cmd)
        cur = self.conn.execute(
            "INSERT INTO sessions(started, ended, host, gputop_version, mode, argv, target_pid, target_cmdline,"
            " interval) VALUES (?, NULL, ?, ?, ?, ?, ?, ?, ?)",
            (time.time(), meta.host, __version__, meta.mode, argv, meta.target_pid, cmd, meta.interval),
        )
        self.session_id = cur.lastrowid
        # Which advisor judges this session's findings: a report by another one judges the samples
        # again rather than print an older verdict as its own (report.rejudge).
        self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                          (advisor_key(self.session_id), advisor_fingerprint()))
        judging = {k: v for k, v in (("stuck_after", meta.stuck_after), ("window", meta.window)) if v is not None}
        if judging:
            self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                              (judging_key(self.session_id), json.dumps(judging)))
        # Removed by finish(): a session whose mark is still there was not closed cleanly.
        self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                          (open_session_key(self.session_id), repr(time.time())))
        return self.session_id  # type: ignore[return-value]

    def target_change(self) -> str | None:
        """One line when this session, appended, follows another process than the file's last
        session did (``sessions.target_change``); None otherwise."""
        return target_change(self.previous_target, self.target, str(self.path))

    # ----------------------------------------------------------------- writing

    def flush(self, samples: Iterable[object]) -> None:
        """Write one group of samples in one transaction."""
        c = self.conn
        c.execute("BEGIN")
        try:
            self._write(samples)
            c.execute("COMMIT")
        except BaseException:
            try:
                c.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        if time.monotonic() - self._checkpointed >= self.checkpoint_every_s:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Copy what the WAL holds into the main file, without waiting on readers (PASSIVE)."""
        self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        self._checkpointed = time.monotonic()

    def _write(self, samples: Iterable[object]) -> None:
        by: dict[type, list] = {}
        for s in samples:
            if isinstance(s, NOT_RECORDED):
                continue
            by.setdefault(type(s), []).append(s)
        n = sum(len(items) for items in by.values())
        if not n:
            return
        c = self.conn
        newest = max(max(s.ts for s in items) for items in by.values())
        oldest = min(min(s.ts for s in items) for items in by.values())
        if self.last_ts is not None:
            newest = max(newest, self.last_ts)
        if self.first_ts is not None:
            oldest = min(oldest, self.first_ts)

        for cls in (SystemInfo, GpuInfo):
            for s in by.get(cls, ()):
                data = codec.info_json(s)
                key = (cls, s.index if isinstance(s, GpuInfo) else None)
                if self._last_info.get(key) != data:
                    self._last_info[key] = data
                    if cls is SystemInfo:
                        c.execute("INSERT INTO system_info(ts, data) VALUES (?, ?)", (s.ts, data))
                    else:
                        c.execute("INSERT INTO gpu_info(ts, gpu, data) VALUES (?, ?, ?)", (s.ts, s.index, data))

        sid = self._string_id
        pts = by.get(UtilPoint)
        if pts:
            pts.sort(key=lambda p: p.ts)
            for p in pts:
                self._overview.add_util(p)
            self._write_block("util", [codec.util_row(p) for p in pts])
        # After the utilisation points: the overview uses a poll's utilisation only for a GPU
        # that has no sample buffer, which it knows once that GPU's points went through.
        gpu = by.get(GpuSample)
        if gpu:
            for s in gpu:
                self.gpus.add(s.index)
                self._overview.add_gpu(s)
            width = len(self._layouts["gpu"])  # a version 1 file's rows stop before the NVLink rates
            self._write_block("gpu", [codec.gpu_row(s, sid)[:width] for s in gpu])
        gp = by.get(GpuProcess)
        if gp:
            self._write_block("gpu_procs", [codec.gpu_proc_row(p, sid) for p in gp])
        host = by.get(HostSample)
        if host:
            # A file before version 3 ends its host rows at shm_used, then the per-core times.
            width = len(self._layouts["host"])
            self._write_block("host", [(r[: width - 1] + r[-1:]) for r in (codec.host_row(h, sid) for h in host)])
        procs = by.get(ProcSample)
        if procs:
            rows = []
            for s in procs:
                s = codec.redact_proc(s)
                rows.append(codec.proc_row(self._proc_id(s), s, sid))
            width = len(self._layouts["procs"])  # a version 1 file's rows stop before the private memory
            self._write_block("procs", [r[:width] for r in rows])
        tasks = by.get(TaskSample)
        if tasks:
            self._write_block("tasks", [codec.task_row(s, sid) for s in tasks])
        stacks = by.get(StackSample)
        if stacks:
            self._write_block(
                "stacks", [(s.ts, self._thread_id(s), self._stack_id(s.frames), codec.stack_flags(s)) for s in stacks]
            )
        events = by.get(Event)
        if events:
            c.executemany(
                "INSERT INTO events(ts, source, level, message) VALUES (?, ?, ?, ?)", [codec.event_row(e) for e in events]
            )
        for f in by.get(Finding, ()):
            self._write_finding(f)

        self.samples += n
        self.first_ts, self.last_ts = oldest, newest
        self._track_span(by)
        self._write_overview(self._overview.take_settled())
        self._compact(newest - COMPACT_SETTLE_S)
        if self.session_id is not None and newest - self._ended_written >= SESSION_END_EVERY_S:
            self._write_ended()

    def _track_span(self, by: dict[type, list]) -> None:
        firsts, lasts = [], []
        for cls in _AS_IT_HAPPENED:
            items = by.get(cls)
            if items:
                firsts.append(min(s.ts for s in items))
                lasts.append(max(s.ts for s in items))
        pts = by.get(UtilPoint)
        if pts:  # sorted above
            lasts.append(pts[-1].ts)
            if self._util_first is None or pts[0].ts < self._util_first:
                self._util_first = pts[0].ts
        if firsts and (self._recorded_first is None or min(firsts) < self._recorded_first):
            self._recorded_first = min(firsts)
        if lasts and (self._series_last is None or max(lasts) > self._series_last):
            self._series_last = max(lasts)

    def span(self) -> Span:
        """What this session added, as ``info`` will count it: its span (the first sample
        recorded as it happened to the last one) and, apart, the GPU utilisation history from
        before it that NVML's buffer gave with the first poll."""
        return recording_span([self._recorded_first], [self._series_last], self._util_first,
                              fallback_start=self._series_last or 0.0)

    def _write_ended(self) -> None:
        if self.session_id is not None and self.last_ts is not None:
            self.conn.execute("UPDATE sessions SET ended = ? WHERE id = ?", (self.last_ts, self.session_id))
            self._ended_written = self.last_ts

    # ----------------------------------------------------------------- blocks

    def _write_block(
        self, series: str, rows: list[tuple], max_span: float = FLUSH_BLOCK_MAX_S, final: bool = False
    ) -> None:
        """``final``: a merged block, packed for good; otherwise the cheap flush-time form."""
        spec = SERIES[series]
        rows.sort(key=lambda r: r[0])
        if series not in self._compacted_to:
            self._compacted_to[series] = math.floor(rows[0][0] / BLOCK_S) * BLOCK_S
        pack = pack_rows if final else pack_rows_json
        for chunk in _chunks(rows, max_span):
            blob = pack(chunk, self._layouts[series])
            key = math.floor(chunk[0][0] * 1000.0)
            # A block starting in the same millisecond as another (two flushes a moment apart)
            # is keyed a millisecond earlier rather than lost; rows keep their own exact times,
            # and readers look a whole block span back anyway.
            for _ in range(1000):
                try:
                    self.conn.execute(
                        f"INSERT INTO {spec.table}(ts_ms, t1, n, data) VALUES (?, ?, ?, ?)",
                        (key, chunk[-1][0], len(chunk), blob),
                    )
                    break
                except sqlite3.IntegrityError:
                    key -= 1

    def _compact(self, upto: float, limit: int = 0) -> None:
        """Merge the small per-flush blocks of each finished minute into one block."""
        limit = limit or MAX_COMPACT_PER_FLUSH
        for series, wm in list(self._compacted_to.items()):
            done = 0
            while wm + BLOCK_S <= upto and done < limit:
                self._compact_range(series, wm, wm + BLOCK_S)
                wm += BLOCK_S
                done += 1
            self._compacted_to[series] = wm

    def _compact_range(self, series: str, t0: float, t1: float) -> None:
        spec = SERIES[series]
        blocks = self.conn.execute(
            f"SELECT ts_ms, n, data FROM {spec.table} WHERE ts_ms >= ? AND ts_ms < ?",
            (math.floor(t0 * 1000.0), math.floor(t1 * 1000.0)),
        ).fetchall()
        if not blocks or (len(blocks) == 1 and blocks[0][2][:1] != bytes([CODEC_JSON])):
            return
        rows: list[tuple] = []
        for _key, n, data in blocks:
            rows += unpack_rows(data, self._layouts[series], n)
        self.conn.executemany(f"DELETE FROM {spec.table} WHERE ts_ms = ?", [(b[0],) for b in blocks])
        self._write_block(series, rows, max_span=MAX_BLOCK_SPAN_S - FLUSH_BLOCK_MAX_S, final=True)

    def _string_id(self, text: str) -> int:
        sid = self._strings.get(text)
        if sid is None:
            cur = self.conn.execute("INSERT INTO strings(text) VALUES (?)", (text,))
            sid = self._strings[text] = cur.lastrowid  # type: ignore[assignment]
        return sid  # type: ignore[return-value]

    def _proc_id(self, s: ProcSample) -> int:
        key = codec.proc_identity(s)
        pid = self._procs.get(key)
        if pid is None:
            cur = self.conn.execute(
                "INSERT INTO processes(pid, ppid, name, user, cmdline, create_time, role, env)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                key,
            )
            pid = self._procs[key] = cur.lastrowid  # type: ignore[assignment]
        return pid  # type: ignore[return-value]

    def _frame_id(self, f: Frame) -> int:
        fid = self._frames.get(f)
        if fid is None:
            cur = self.conn.execute(
                "INSERT INTO frames(name, filename, line, module, code, keeps) VALUES (?, ?, ?, ?, ?, ?)",
                # A second pass over what the stack source redacted (once per distinct frame):
                # a recording outlives the screen, and not every source is the stack sampler.
                (f.name, f.filename, f.line, f.module, redact_code(f.code) if f.code else f.code,
                 codec.keeps_text(f)),
            )
            fid = self._frames[f] = cur.lastrowid  # type: ignore[assignment]
        return fid  # type: ignore[return-value]

    def _stack_id(self, frames: tuple[Frame, ...]) -> int:
        sid = self._stacks_by_frames.get(frames)
        if sid is None:
            blob = pack_ids([self._frame_id(f) for f in frames])
            sid = self._stacks_by_ids.get(blob)
            if sid is None:
                cur = self.conn.execute("INSERT INTO stacks(frames) VALUES (?)", (blob,))
                sid = self._stacks_by_ids[blob] = cur.lastrowid  # type: ignore[assignment]
            self._stacks_by_frames[frames] = sid  # type: ignore[assignment]
        return sid  # type: ignore[return-value]

    def _thread_id(self, s: StackSample) -> int:
        key = (s.pid, s.thread_id, s.thread_name, bool(s.is_main), s.os_thread_id)
        tid = self._threads.get(key)
        if tid is None:
            cur = self.conn.execute(
                "INSERT INTO threads(pid, thread_id, thread_name, is_main, os_thread_id) VALUES (?, ?, ?, ?, ?)",
                (s.pid, s.thread_id, s.thread_name, int(bool(s.is_main)), s.os_thread_id),
            )
            tid = self._threads[key] = cur.lastrowid  # type: ignore[assignment]
        return tid  # type: ignore[return-value]

    def _write_finding(self, f: Finding) -> None:
        key = (f.id, f.gpu_index)
        sig = codec.finding_signature(f)
        prev = self._findings.get(key)
        if prev is not None and prev[1] == sig:
            # Still seen with the same words: its numbers (the bound among them) are the newest.
            if self._gain_col:
                self.conn.execute(
                    "UPDATE findings SET last_seen = max(last_seen, ?), confidence = ?, cost_s = ?,"
                    " gain_predicted = ? WHERE id = ?",
                    (f.ts, f.confidence, f.cost_s, codec.gain_bound(f.gain_predicted), prev[0]),
                )
            else:
                self.conn.execute(
                    "UPDATE findings SET last_seen = max(last_seen, ?), confidence = ?, cost_s = ? WHERE id = ?",
                    (f.ts, f.confidence, f.cost_s, prev[0]),
                )
            return
        row = codec.finding_row(f)
        if self._gain_col:
            cur = self.conn.execute(
                "INSERT INTO findings(ts, last_seen, finding_id, gpu, severity, confidence, title, evidence, action,"
                " expected_gain, cost_s, first_seen, gain_predicted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
        else:
            cur = self.conn.execute(
                "INSERT INTO findings(ts, last_seen, finding_id, gpu, severity, confidence, title, evidence, action,"
                " expected_gain, cost_s, first_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row[:12],
            )
        self._findings[key] = (cur.lastrowid, sig)  # type: ignore[assignment]

    def _write_overview(self, rows: list[OverviewRow]) -> None:
        if rows:
            self.conn.executemany(
                _UPSERT_OVERVIEW,
                [
                    (r.ts, r.gpu, r.span, r.covered_s, r.busy_s, r.low_s, r.util_max, r.mem_used_max, r.power_avg, r.polls)
                    for r in rows
                ],
            )

    # ----------------------------------------------------------------- closing

    def finish(self) -> None:
        """Write what is still pending in the overview and close (checkpoints the WAL)."""
        try:
            self.conn.execute("BEGIN")
            self._write_overview(self._overview.take_all())
            self._write_ended()
            if self.session_id is not None:
                self.conn.execute("DELETE FROM meta WHERE key = ?", (open_session_key(self.session_id),))
            if self.last_ts is not None:
                # Everything is final now: merge up to and including the last minute.
                self._compact(self.last_ts + BLOCK_S, limit=1_000_000)
            self.conn.execute("COMMIT")
            # A finished recording is one self-contained file: fold the WAL back in, so copying
            # the file copies everything and readers leave no -wal/-shm beside it.
            self.conn.execute("PRAGMA journal_mode=DELETE")
        finally:
            try:
                self.conn.close()
            finally:
                _release(self._lock)
                self._lock = None

    def abort(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:
            pass
        _release(self._lock)
        self._lock = None


def _recorded_identity(conn: sqlite3.Connection) -> Identity:
    """What the recording's first session watched (its first static info)."""
    samples: list[object] = []
    rows = conn.execute("SELECT ts, data FROM system_info ORDER BY ts LIMIT 1").fetchall()
    samples += codec.iter_valid(rows, codec.system_info_from_row)[0]
    first: dict[int, tuple] = {}
    for row in conn.execute("SELECT ts, gpu, data FROM gpu_info ORDER BY ts"):
        first.setdefault(row[1], row)
    samples += codec.iter_valid(list(first.values()), codec.gpu_info_from_row)[0]
    return Identity.of(samples)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=5.0)
    return conn


def _chunks(rows: list[tuple], max_span: float) -> Iterable[list[tuple]]:
    """Split time-sorted rows so that no chunk spans more than ``max_span``."""
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][0] - rows[start][0] >= max_span:
            yield rows[start:i]
            start = i


_UPSERT_OVERVIEW = """
INSERT INTO overview(ts, gpu, span, covered_s, busy_s, low_s, util_max, mem_used_max, power_avg, polls)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT(ts, gpu) DO UPDATE SET
    covered_s = covered_s + excluded.covered_s,
    busy_s = busy_s + excluded.busy_s,
    low_s = low_s + excluded.low_s,
    util_max = max(coalesce(util_max, excluded.util_max), coalesce(excluded.util_max, util_max)),
    mem_used_max = max(coalesce(mem_used_max, excluded.mem_used_max), coalesce(excluded.mem_used_max, mem_used_max)),
    power_avg = CASE WHEN polls + excluded.polls > 0 THEN
        (coalesce(power_avg, 0) * polls + coalesce(excluded.power_avg, 0) * excluded.polls) / (polls + excluded.polls)
        END,
    polls = polls + excluded.polls
"""


# looks_like_recording and sidecars live in record.files; importable from here too.
__all__ = ["Identity", "RecordWriter", "SessionMeta", "looks_like_recording", "sidecars"]
