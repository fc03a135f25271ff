"""Reading a recording: time-window queries for replay and report, and what the file holds.

Opening it (the checks that refuse a file, a left-over ``-wal``, a cut copy) is ``opening``'s.
A damaged file (truncated copy, bad sectors) is read as far as it can be: every query returns
the rows it could read before SQLite gave up, and ``damage`` says where the readable part ends.
Nothing in the file is executed; every value is type-checked on the way in (see ``codec``).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import sqlite3
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import UserError
from ..redact import redact_cmdline
from ..model import (Event, Finding, GpuInfo, GpuProcess, GpuSample, HostSample, ProcSample, StackSample, SystemInfo,
                     TaskSample, UtilPoint)
from ..units import fmt_seconds, fmt_time
from . import codec
from .opening import fold_wal, open_recording
from .overview import OverviewBuilder, OverviewRow
from .salvage import SalvagedSeries, readable_keys
from .sessions import session_spans
from .span import recording_span
from .blocks import unpack_rows
from .schema import (
    ADVISOR_PREFIX,
    JUDGING_PREFIX,
    STATE_EVENT_SOURCES,
    FINDINGS_OPTIONAL,
    FRAMES_KEEPS,
    FLAG_ACTIVE,
    FLAG_GIL,
    GPU_FIELDS,
    GPU_PROC_FIELDS,
    MAX_BLOCK_SPAN_S,
    OPEN_SESSION_PREFIX,
    PROC_FIELDS,
    TASK_FIELDS,
    SERIES,
    SERIES_TABLES,
    series_layouts,
    unpack_ids,
)

# The GPU rows' columns holding string ids (`error`), after (ts, index); a version 1 file's
# narrower rows have them at the same places.
_GPU_STRING_COLS = tuple(2 + i for i, f in enumerate(GPU_FIELDS) if f.kind == "s")
_TASK_STRING_COLS = tuple(1 + i for i, f in enumerate(TASK_FIELDS) if f.kind == "s")

# Decoded blocks kept in memory: a replay at speed re-reads the block it is in ten times a
# second. 128 one-minute blocks of the largest series (stacks, ~1,200 rows) is ~20 MB at most.
BLOCK_CACHE = 128
# A recording's size per GPU-hour is extrapolated only from one at least this long. An empty
# file (schema, first blocks) takes ~90 KB whatever its length, and the default rates add ~0.7 MB
# per GPU-hour: from 6 s the rate came out at 28 MB, from 45 s 8.5 MB. From half an hour the
# samples (~350 KB) outweigh the fixed part four to one, so the rate is within ~25 %.
MIN_RATE_SPAN_S = 1800.0


class Reader:
    """One open recording. Thread-safe (one lock around the connection)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._any_series = False  # a sample or an event could be read
        self.bad_rows = 0
        self._finding_cols_sql: str | None = None
        self._keeps_sql: str | None = None
        self.conn, found = open_recording(self.path)
        self.schema_version = found.schema_version
        # Series whose table the file has: one added since (the tasks) is absent from older files,
        # which hold none of it rather than a damaged table.
        try:
            present = {n for (n,) in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError:
            present = set(SERIES_TABLES)
        self._series = [name for name, spec in SERIES.items() if spec.table in present or name != "tasks"]
        self._layouts = series_layouts(self.schema_version)  # a version 1 file's GPU rows are narrower
        self.wal_state = found.wal_state
        self._tmp: tempfile.TemporaryDirectory | None = found.tmp
        self.damage: str | None = found.damage
        # Tables a cut copy lost, whole or past the cut; of those, the ones with rows before it
        # (settled once the file is open: ``_settle_lost``). ``lost`` says it per kind of data.
        self.lost_tables: list[str] = found.lost_tables
        self.partly_tables: list[str] = found.partly_tables
        self._cut: str | None = found.cut  # "truncated (N of M bytes)" for a cut copy
        self._threads: dict[int, tuple[int, int, str, bool, int | None]] = {}
        self._stacks: dict[int, tuple] = {}
        self._frames: dict[int, Any] = {}
        self._procs: dict[int, dict[str, Any]] = {}
        self._overview: list[OverviewRow] | None = None
        self._strings: dict[int, str] | None = None
        self._cache: OrderedDict[tuple, list[tuple]] = OrderedDict()
        # Series read block by block from their readable keys (a damaged file), by name.
        self._salvaged: dict[str, SalvagedSeries] = {}
        try:
            self.meta = dict(self._rows("SELECT key, value FROM meta"))
            self.sessions = [
                dict(zip(("id", "started", "ended", "host", "gputop_version", "mode", "argv", "target_pid",
                          "target_cmdline", "interval"), r))
                for r in self._rows("SELECT id, started, ended, host, gputop_version, mode, argv, target_pid,"
                                    " target_cmdline, interval FROM sessions ORDER BY id")
            ]
            for s in self.sessions:
                for k in ("host", "gputop_version", "mode", "argv", "target_cmdline"):
                    s[k] = codec.opt_text(s[k])
                for k in ("argv", "target_cmdline"):  # redacted again: see proc_identity_from_row
                    if s[k]:
                        s[k] = redact_cmdline(s[k].split(" "))
                for k in ("started", "ended", "interval"):
                    s[k] = codec.fnum(s[k])
                s["target_pid"] = codec.inum(s["target_pid"])
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise UserError(f"{self.path} is damaged and cannot be read: {exc}") from None
        # Sessions whose writer never closed them (killed, disk full, power cut): their mark is
        # still in `meta` (see schema.OPEN_SESSION_PREFIX).
        self.unclosed_sessions = sorted(
            n for k in self.meta
            if isinstance(k, str) and k.startswith(OPEN_SESSION_PREFIX)
            for n in [codec.inum(_int_or_none(k[len(OPEN_SESSION_PREFIX):]))] if n is not None
        )
        if self.partly_tables:
            self._settle_lost(found.cut or "")
        self.start_ts, self.end_ts = self._span()
        if self.damage is not None and not self._holds_data():
            # A cut that left only the header (or the sessions' rows): reading it as an empty
            # recording would show 1970 dates, "no GPU" and a replay waiting for data forever.
            self.close()
            raise UserError(f"{self.path} is {self._cut or 'damaged'}: nothing readable survived "
                            "(no samples, events or findings)")

    def _settle_lost(self, cut: str) -> None:
        """A table the cut went through with no row readable before it is lost, not "partly
        lost": the DAMAGED line said findings were partly lost while the report and info said
        they were lost. Said once here, so every reader says the same."""
        from .opening import damage_text

        empty = [t for t in self.partly_tables if not self._rows(f'SELECT 1 FROM "{t}" LIMIT 1')]
        if not empty:
            return
        whole = [t for t in self.lost_tables if t not in self.partly_tables] + empty
        self.partly_tables = [t for t in self.partly_tables if t not in empty]
        self.lost_tables = whole + self.partly_tables
        detail = cut[len("truncated"):] if cut.startswith("truncated") else ""
        self.damage = damage_text(self.path, detail, whole, self.partly_tables)

    def lost(self, what: str) -> str | None:
        """What a cut or damaged file kept of one kind of data: ``"lost"`` (nothing of it can be
        read), ``"partly"`` (rows past the cut are gone), None (all of it). ``what``: a table's
        name, or ``"stacks"``: stack samples with what they need to be read (their stacks, frames
        and threads). info, report and replay all ask here, so they agree on what survived."""
        whole = set(self.lost_tables) - set(self.partly_tables)
        if what == "stacks":
            # Without its row, its stack or its thread a sample cannot be read; without frames
            # it still can (its category is in its row): what is lost is where it was.
            if whole & {"stack_samples", "stacks", "threads"}:
                return "lost"
            return "partly" if set(self.lost_tables) & set(STACK_TABLES) else None
        if what in whole:
            return "lost"
        return "partly" if what in self.partly_tables else None

    def _holds_data(self) -> bool:
        return self._any_series or bool(self._rows("SELECT 1 FROM findings LIMIT 1"))

    def close(self) -> None:
        with self._lock:
            self.conn.close()
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- low level

    def _rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """All rows SQLite can read; on damage, the rows before it, and a note in ``damage``."""
        out: list[tuple] = []
        with self._lock:
            try:
                for row in self.conn.execute(sql, params):
                    out.append(row)
            except sqlite3.DatabaseError as exc:
                self._note_damage(exc, params)
        return out

    def _note_damage(self, exc: BaseException, params: tuple = ()) -> None:
        if self.damage is None:
            near = next((p for p in reversed(params) if isinstance(p, float) and abs(p) != float("inf")), None)
            where = f" near {fmt_time(near)}" if near is not None else ""
            self.damage = f"{self.path} is damaged ({exc}){where}: showing what could be read"

    def _decode(self, rows: Iterable[tuple], fn: Callable) -> list:
        items, bad = codec.iter_valid(rows, fn)
        self.bad_rows += bad
        return items

    # ----------------------------------------------------------------- blocks

    def _block_rows(self, series: str, t0: float, t1: float) -> list[tuple]:
        """Rows of ``series`` with t0 < ts <= t1, in time order."""
        if series not in self._series:
            return []
        spec = SERIES[series]
        out: list[tuple] = []
        lo = _ms(t0 - MAX_BLOCK_SPAN_S)
        hi = _ms(t1)
        salvaged = self._salvaged.get(series)
        if salvaged is not None:
            # A damaged series is read through the blocks found readable, as its span and its
            # count were: a range query would stop at the first missing page.
            blocks = salvaged.between(lo, hi)
        else:
            blocks = self._rows(
                f"SELECT ts_ms, n FROM {spec.table} WHERE ts_ms > ? AND ts_ms <= ? AND t1 > ? ORDER BY ts_ms",
                (lo, hi, t0),
            )
        for key, n in blocks:
            rows = self._block(spec.table, self._layouts[series], key, n)
            if not rows:
                continue
            if t0 < rows[0][0] and rows[-1][0] <= t1:
                out += rows
            else:
                ts = [r[0] for r in rows]
                out += rows[bisect.bisect_right(ts, t0) : bisect.bisect_right(ts, t1)]
        if len(blocks) > 1:
            out.sort(key=lambda r: r[0])
        return out

    def _block(self, table: str, layout: str, key: float, n: int) -> list[tuple]:
        ck = (table, key, n)
        rows = self._cache.get(ck)
        if rows is not None:
            self._cache.move_to_end(ck)
            return rows
        data = self._rows(f"SELECT data FROM {table} WHERE ts_ms = ?", (key,))
        try:
            if not data or codec.inum(n) is None:
                raise ValueError("missing block")
            rows = unpack_rows(data[0][0], layout, n)
            rows.sort(key=lambda r: r[0])
        except ValueError:
            self.bad_rows += 1
            rows = []
        self._cache[ck] = rows
        if len(self._cache) > BLOCK_CACHE:
            self._cache.popitem(last=False)
        return rows

    def _series_span(self, series: str) -> tuple[float | None, float | None, bool]:
        """(first, last) timestamp of a series, and whether its blocks' index could be read whole."""
        if series not in self._series:
            return None, None, True
        spec = SERIES[series]
        if self.damage is None and series not in self._salvaged:
            with self._lock:
                try:
                    first = self.conn.execute(f"SELECT ts_ms, n FROM {spec.table} ORDER BY ts_ms LIMIT 1").fetchone()
                    tail = self.conn.execute(f"SELECT t1 FROM {spec.table} ORDER BY ts_ms DESC LIMIT 16").fetchall()
                except sqlite3.DatabaseError:
                    first = None
                else:
                    start = None
                    if first is not None:
                        rows = self._block(spec.table, self._layouts[series], first[0], first[1])
                        start = rows[0][0] if rows else None
                    ends = [codec.fnum(t) for (t,) in tail if codec.fnum(t) is not None]
                    return start, (max(ends) if ends else None), True  # type: ignore[type-var]
        # Damaged: what survived is what a read in time order reaches, past missing pages; every
        # reader of this series goes by the same blocks from now on.
        first, last = self._salvage(series).span()
        return first, last, False

    def _salvage(self, series: str) -> SalvagedSeries:
        found = self._salvaged.get(series)
        if found is None:
            spec = SERIES[series]
            ends = [s["ended"] or s["started"] for s in self.sessions if (s["ended"] or s["started"])]
            until = _ms(max(ends) + MAX_BLOCK_SPAN_S) if ends else 0
            with self._lock:
                keys = readable_keys(self.conn, spec.table, until)
            found = self._salvaged[series] = SalvagedSeries(
                keys, lambda key, n: self._block(spec.table, self._layouts[series], key, n))
        return found

    def _span(self) -> tuple[float, float]:
        firsts, ends = [], []
        unreadable = []
        backfill_first = None
        lead_end = None  # where the GPU (else host) series ends: what a damaged replay follows
        for name in self._series:
            first, last, ok = self._series_span(name)
            if not ok:
                unreadable.append(name)
            if first is not None:
                # The utilisation buffer reaches back before the recorder started (see span.py).
                if name == "util":
                    backfill_first = first
                else:
                    firsts.append(first)
            if last is not None:
                ends.append(last)
                if lead_end is None and name in ("gpu", "host"):
                    lead_end = last
        for (v,) in self._rows("SELECT min(ts) FROM events"):
            if codec.fnum(v) is not None:
                firsts.append(v)
        for (v,) in self._rows("SELECT max(ts) FROM events"):
            if codec.fnum(v) is not None:
                ends.append(v)
        self._any_series = bool(firsts or ends or backfill_first is not None)
        if (self.damage or unreadable) and lead_end is not None:
            ends = [lead_end]
        fallback = (self.sessions[0]["started"] if self.sessions else 0.0) or 0.0
        self.span = recording_span(firsts, ends, backfill_first, fallback)
        start, end = self.span.start, self.span.end
        recorded_end = max((s["ended"] or 0.0 for s in self.sessions), default=0.0)
        # The writer stores the session's end with the samples (at most SESSION_END_EVERY_S
        # behind them), so readable data ending well before it means pages are missing.
        if self.damage or unreadable or (recorded_end and recorded_end - end > 2.0):
            lost = f", {fmt_seconds(recorded_end - end)} before the recorded end" if recorded_end > end else ""
            what = self.damage or f"{self.path} is damaged"
            self.damage = f"{what}: readable data ends at {fmt_time(end)}{lost}"
        return start, end

    def first_poll_ts(self) -> float:
        """When the first GPU (else host) poll was taken: where a replay starts."""
        for name in ("gpu", "host"):
            first, _last, _ok = self._series_span(name)
            if first is not None:
                return first
        return self.start_ts

    def check_blocks(self) -> int:
        """Decode every block (``info --check``): how many could not be read."""
        bad = 0
        for name in self._series:
            spec = SERIES[name]
            keys = self._rows(f"SELECT ts_ms, n FROM {spec.table} ORDER BY ts_ms")
            for key, n in keys:
                before = self.bad_rows
                if not self._block(spec.table, self._layouts[name], key, n) or self.bad_rows != before:
                    bad += 1
            self._cache.clear()
        return bad

    # ----------------------------------------------------------------- what it holds

    @property
    def duration(self) -> float:
        return max(0.0, self.end_ts - self.start_ts)

    def gpu_indices(self) -> list[int]:
        found = {g for (g,) in self._rows("SELECT DISTINCT gpu FROM gpu_info") if isinstance(g, int)}
        found |= {r[1] for r in self._block_rows("gpu", self.start_ts - 1, self.start_ts + 60) if r[1] is not None}
        return sorted(found)

    def size_bytes(self) -> int:
        total = 0
        for p in (self.path, Path(f"{self.path}-wal")):
            try:
                total += p.stat().st_size
            except OSError:
                pass
        return total

    def counts(self) -> dict[str, int]:
        out = {}
        tables = {SERIES[name].table: name for name in self._series}
        for t in tables:
            name = tables.get(t)
            if name is not None and (self.damage is not None or name in self._salvaged):
                # What a read returns, not what the index says was written: blocks whose data
                # the damage took are not counted, nor rows past where the readable data ends
                # (the span a report and a replay cover), nor stack samples whose stacks, frames
                # or threads the cut took, nor process samples whose process rows it took (no
                # reader can use them).
                upto = (float("-inf"), self.end_ts)
                if name == "stacks" and self.lost("stacks"):
                    out[t] = len(self.stack_samples(*upto))
                elif name == "procs" and self.lost("processes"):
                    out[t] = len(self.proc_samples(*upto))
                else:
                    out[t] = len(self._block_rows(name, *upto))
                continue
            rows = self._rows(f"SELECT sum(n) FROM {t}")
            out[t] = (rows[0][0] or 0) if rows else 0
        for t in ("events", "findings", "frames", "stacks", "threads", "processes"):
            rows = self._rows(f"SELECT count(*) FROM {t}")
            out[t] = rows[0][0] if rows else 0
        return out

    # ----------------------------------------------------------------- static info

    def system_info(self, at: float | None = None) -> SystemInfo | None:
        at = self.end_ts if at is None else at
        rows = self._rows("SELECT ts, data FROM system_info WHERE ts <= ? ORDER BY ts DESC LIMIT 1", (at,))
        if not rows:
            rows = self._rows("SELECT ts, data FROM system_info ORDER BY ts LIMIT 1")
        items = self._decode(rows, codec.system_info_from_row)
        return items[0] if items else None

    def gpu_infos(self, at: float | None = None) -> list[GpuInfo]:
        """The latest GpuInfo per GPU at ``at`` (or the first one, for a GPU not yet seen)."""
        at = self.end_ts if at is None else at
        best: dict[int, tuple] = {}
        for r in self._rows("SELECT ts, gpu, data FROM gpu_info ORDER BY ts"):
            g = r[1]
            if isinstance(g, int) and isinstance(r[0], float) and (g not in best or r[0] <= at):
                best[g] = r
        return self._decode([best[g] for g in sorted(best)], codec.gpu_info_from_row)

    def _static_between(self, t0: float, t1: float) -> list[object]:
        out: list[object] = self._decode(
            self._rows("SELECT ts, data FROM system_info WHERE ts > ? AND ts <= ? ORDER BY ts", (t0, t1)),
            codec.system_info_from_row,
        )
        out += self._decode(
            self._rows("SELECT ts, gpu, data FROM gpu_info WHERE ts > ? AND ts <= ? ORDER BY ts", (t0, t1)),
            codec.gpu_info_from_row,
        )
        return out

    # ----------------------------------------------------------------- series

    def strings(self) -> dict[int, str]:
        if self._strings is None:
            self._strings = {
                i: codec.clean_text(t, 256) for i, t in self._rows("SELECT id, text FROM strings") if isinstance(i, int)
            }
        return self._strings

    def _refresh_strings(self, rows: list[tuple], cols: Iterable[int]) -> dict[int, str]:
        # A file still being written gains strings; reload once when an id is unknown.
        strings = self.strings()
        for r in rows:
            for c in cols:
                if r[c] is not None and r[c] not in strings:
                    self._strings = None
                    return self.strings()
        return strings

    def gpu_samples(self, t0: float, t1: float, gpu: int | None = None) -> list[GpuSample]:
        rows = self._block_rows("gpu", t0, t1)
        if gpu is not None:
            rows = [r for r in rows if r[1] == gpu]
        strings = self._refresh_strings(rows, _GPU_STRING_COLS)
        return self._decode(rows, lambda r: codec.gpu_from_row(r, strings))

    def util_points(self, t0: float, t1: float, gpu: int | None = None) -> list[UtilPoint]:
        rows = self._block_rows("util", t0, t1)
        if gpu is not None:
            rows = [r for r in rows if r[1] == gpu]
        return self._decode(rows, codec.util_from_row)

    def gpu_processes(self, t0: float, t1: float) -> list[GpuProcess]:
        rows = self._block_rows("gpu_procs", t0, t1)
        strings = self._refresh_strings(rows, (len(GPU_PROC_FIELDS),))
        return self._decode(rows, lambda r: codec.gpu_proc_from_row(r, strings))

    def host_samples(self, t0: float, t1: float) -> list[HostSample]:
        rows = self._block_rows("host", t0, t1)
        return self._decode(rows, lambda r: codec.host_from_row(r, {}))

    def task_samples(self, t0: float, t1: float) -> list[TaskSample]:
        """The processes' /proc readings (each with its main thread's only; see schema.TASK_FIELDS)."""
        rows = self._block_rows("tasks", t0, t1)
        strings = self._refresh_strings(rows, _TASK_STRING_COLS)
        return self._decode(rows, lambda r: codec.task_from_row(r, strings))

    def proc_samples(self, t0: float, t1: float) -> list[ProcSample]:
        rows = self._block_rows("procs", t0, t1)
        self._load_procs({r[1] for r in rows if r[1] not in self._procs})
        strings = self._refresh_strings(rows, (2 + [f.name for f in PROC_FIELDS].index("status"),))
        return self._decode(rows, lambda r: codec.proc_from_row(r, self._procs, strings))

    def _load_procs(self, ids: set) -> None:
        idl = sorted(i for i in ids if isinstance(i, int))
        for k in range(0, len(idl), 500):
            part = idl[k : k + 500]
            for row in self._rows(
                "SELECT id, pid, ppid, name, user, cmdline, create_time, role, env FROM processes"
                f" WHERE id IN ({','.join('?' * len(part))})",
                tuple(part),
            ):
                try:
                    self._procs[row[0]] = codec.proc_identity_from_row(row)
                except (ValueError, TypeError):
                    self.bad_rows += 1

    def threads(self) -> dict[int, tuple[int, int, str, bool, int | None]]:
        """Thread id in the file -> (pid, thread_id, thread_name, is_main, os_thread_id)."""
        if not self._threads:
            for tid, pid, thread_id, name, is_main, os_tid in self._rows(
                "SELECT id, pid, thread_id, thread_name, is_main, os_thread_id FROM threads"
            ):
                if isinstance(tid, int) and isinstance(pid, int) and isinstance(thread_id, int):
                    self._threads[tid] = (pid, thread_id, codec.clean_text(name, 256), bool(is_main), codec.inum(os_tid))
        return self._threads

    def stack_rows(self, t0: float, t1: float) -> list[tuple]:
        """(ts, file thread id, file stack id, flags) in (t0, t1]: what the report needs, cheaply."""
        return self._block_rows("stacks", t0, t1)

    def stack_samples(self, t0: float, t1: float, main_only: bool = False, pid: int | None = None) -> list[StackSample]:
        rows = self._block_rows("stacks", t0, t1)
        threads = self.threads()
        if any(r[1] not in threads for r in rows):
            self._threads = {}
            threads = self.threads()
        self._load_stacks({r[2] for r in rows if r[2] not in self._stacks})
        out: list[StackSample] = []
        flags = _FLAGS
        stacks = self._stacks
        for ts, th, st, fl in rows:
            t = threads.get(th)  # type: ignore[arg-type]
            frames = stacks.get(st)  # type: ignore[arg-type]
            f = flags.get(fl)  # type: ignore[arg-type]
            if t is None or frames is None or f is None:
                self.bad_rows += 1
                continue
            if (main_only and not t[3]) or (pid is not None and t[0] != pid):
                continue
            # Positional, in StackSample's field order (a test pins it): a seek builds thousands.
            out.append(StackSample(ts, t[0], t[1], t[2], frames, f[0], f[1], t[3], f[2], t[4]))
        return out

    def frames_of(self, stack_id: int) -> tuple:
        self._load_stacks({stack_id} - set(self._stacks))
        return self._stacks.get(stack_id, ())

    def _load_stacks(self, ids: set) -> None:
        ids = {i for i in ids if isinstance(i, int)}
        if not ids:
            return
        rows = []
        idl = sorted(ids)
        for i in range(0, len(idl), 500):
            part = idl[i : i + 500]
            rows += self._rows(f"SELECT id, frames FROM stacks WHERE id IN ({','.join('?' * len(part))})", tuple(part))
        parsed: dict[int, tuple[int, ...]] = {}
        need: set[int] = set()
        for sid, blob in rows:
            try:
                fids = unpack_ids(blob)
            except ValueError:
                self.bad_rows += 1
                continue
            parsed[sid] = fids
            need.update(f for f in fids if f not in self._frames)
        fl = sorted(need)
        for i in range(0, len(fl), 500):
            part = fl[i : i + 500]
            for row in self._rows(
                f"SELECT id, name, filename, line, module, code, {self._keeps_col()} FROM frames"
                f" WHERE id IN ({','.join('?' * len(part))})",
                tuple(part),
            ):
                try:
                    self._frames[row[0]] = codec.frame_from_row(row)
                except (ValueError, TypeError):
                    self.bad_rows += 1
        for sid, fids in parsed.items():
            self._stacks[sid] = tuple(self._frames[f] for f in fids if f in self._frames)

    def events(self, t0: float, t1: float, last: int | None = None) -> list[Event]:
        if last:
            rows = self._rows(
                "SELECT ts, source, level, message FROM events WHERE ts > ? AND ts <= ? ORDER BY ts DESC LIMIT ?",
                (t0, t1, last),
            )
            rows.reverse()
        else:
            rows = self._rows("SELECT ts, source, level, message FROM events WHERE ts > ? AND ts <= ? ORDER BY ts",
                              (t0, t1))
        return self._decode(rows, codec.event_from_row)

    _FINDING_BASE_COLS = ("ts, last_seen, finding_id, gpu, severity, confidence, title, evidence, action,"
                          " expected_gain, cost_s, first_seen")

    def _keeps_col(self) -> str:
        # A file from before frames.keeps (schema.FRAMES_KEEPS): NULL, every frame's keeps empty.
        if self._keeps_sql is None:
            have = {r[1] for r in self._rows("PRAGMA table_info(frames)")}
            self._keeps_sql = FRAMES_KEEPS if FRAMES_KEEPS in have else f"NULL AS {FRAMES_KEEPS}"
        return self._keeps_sql

    def _finding_cols(self) -> str:
        # A file from before findings.gain_predicted (schema.FINDINGS_OPTIONAL) lacks the
        # column: NULL in its place, so those findings read gain_predicted None.
        cols = self._finding_cols_sql
        if cols is None:
            have = {r[1] for r in self._rows("PRAGMA table_info(findings)")}
            cols = self._FINDING_BASE_COLS + "".join(
                f", {c}" if c in have else f", NULL AS {c}" for c in FINDINGS_OPTIONAL
            )
            self._finding_cols_sql = cols
        return cols

    def findings(self, t0: float = float("-inf"), t1: float = float("inf"), last: int | None = None) -> list[Finding]:
        if last:
            rows = self._rows(
                f"SELECT {self._finding_cols()} FROM findings WHERE ts > ? AND ts <= ? ORDER BY ts DESC LIMIT ?",
                (t0, t1, last),
            )
            rows.reverse()
        else:
            rows = self._rows(f"SELECT {self._finding_cols()} FROM findings WHERE ts > ? AND ts <= ? ORDER BY ts",
                              (t0, t1))
        return self._decode(rows, codec.finding_from_row)

    def finding_rows(self) -> list[tuple[Finding, float]]:
        """Every recorded finding with the last time it was still reported."""
        rows = self._rows(f"SELECT {self._finding_cols()} FROM findings ORDER BY ts")
        out = []
        for r in rows:
            try:
                out.append((codec.finding_from_row(r), codec.fnum(r[1]) or codec.req_float(r[0])))
            except (ValueError, TypeError):
                self.bad_rows += 1
        return out

    # ----------------------------------------------------------------- composite

    def samples(self, t0: float, t1: float) -> list[object]:
        """Everything recorded in (t0, t1]: what a replay emits as time moves on."""
        out: list[object] = self._static_between(t0, t1)
        out += self.gpu_samples(t0, t1)
        out += self.util_points(t0, t1)
        out += self.gpu_processes(t0, t1)
        out += self.host_samples(t0, t1)
        out += self.proc_samples(t0, t1)
        out += self.stack_samples(t0, t1)
        out += self.task_samples(t0, t1)
        out += self.events(t0, t1)
        out += self.findings(t0, t1)
        return out

    def history(self, ts: float, windows) -> list[object]:
        """The state at ``ts``: static info as of then, and the last stretch of every series
        (how far back each: ``windows``, see ``replay.HistoryWindows``)."""
        out: list[object] = []
        sysinfo = self.system_info(ts)
        if sysinfo is not None:
            out.append(sysinfo)
        out += self.gpu_infos(ts)
        out += self.gpu_samples(ts - windows.gpu, ts)
        out += self.util_points(ts - windows.util, ts)
        out += self.gpu_processes(ts - windows.gpu_processes, ts)
        out += self.host_samples(ts - windows.host, ts)
        out += self.proc_samples(ts - windows.procs, ts)
        out += self.stack_samples(ts - windows.stacks, ts)
        out += self.task_samples(ts - windows.tasks, ts)
        events = self.events(float("-inf"), ts, last=windows.events)
        # The job's shape as of ``ts`` (its rank map, its GPUs' links) is said once, at the start:
        # a seek past many later events still gets the newest of each.
        for source in STATE_EVENT_SOURCES:
            if not any(e.source == source for e in events):
                events = self._last_event(source, ts) + events
        out += events
        out += self.findings(float("-inf"), ts, last=windows.findings)
        return out

    def _last_event(self, source: str, ts: float) -> list[Event]:
        rows = self._rows("SELECT ts, source, level, message FROM events WHERE source = ? AND ts <= ? "
                          "ORDER BY ts DESC LIMIT 1", (source, ts))
        return self._decode(rows, codec.event_from_row)

    # ----------------------------------------------------------------- overview

    def overview(self) -> list[OverviewRow]:
        """Per-GPU busy/idle sums per bucket over the whole recording (cached).

        Buckets the writer did not get to write (a killed recorder) are rebuilt from the raw
        samples after the last stored one.
        """
        if self._overview is not None:
            return self._overview
        rows: list[OverviewRow] = []
        for r in self._rows(
            "SELECT ts, gpu, span, covered_s, busy_s, low_s, util_max, mem_used_max, power_avg, polls"
            " FROM overview ORDER BY ts, gpu"
        ):
            try:
                ts, gpu, span = codec.req_float(r[0]), codec.inum(r[1]), codec.fnum(r[2])
                if gpu is None or not span or span <= 0:
                    raise ValueError
            except ValueError:
                self.bad_rows += 1
                continue
            polls = codec.inum(r[9]) or 0
            pavg = codec.fnum(r[8])
            rows.append(
                OverviewRow(
                    ts=ts,
                    gpu=gpu,
                    span=span,
                    covered_s=codec.fnum(r[3]) or 0.0,
                    busy_s=codec.fnum(r[4]) or 0.0,
                    low_s=codec.fnum(r[5]) or 0.0,
                    util_max=codec.fnum(r[6]),
                    mem_used_max=codec.inum(r[7]),
                    power_sum=(pavg or 0.0) * polls,
                    polls=polls,
                )
            )
        covered_to = max((r.ts + r.span for r in rows), default=None)
        tail_from = self.start_ts - 1.0 if covered_to is None else covered_to
        if tail_from < self.end_ts:
            rows += self._rebuild_overview(tail_from, self.end_ts)
        rows.sort(key=lambda r: (r.ts, r.gpu))
        self._overview = rows
        return rows

    def _rebuild_overview(self, t0: float, t1: float, step: float = 3600.0) -> list[OverviewRow]:
        b = OverviewBuilder()
        t = t0
        while t < t1:
            e = min(t1, t + step)
            for s in self.gpu_samples(t, e):
                b.add_gpu(s)
            for p in self.util_points(t, e):
                b.add_util(p)
            t = e
        return [r for r in b.take_all() if r.ts + r.span > t0]

    def finding_mark_rows(self) -> list[tuple]:
        """(ts, last_seen, id, severity, title, gpu) of every recorded finding, in time order."""
        return self._rows("SELECT ts, last_seen, finding_id, severity, title, gpu FROM findings ORDER BY ts")

    # ----------------------------------------------------------------- summary for `info`

    def judging(self) -> dict[int, dict[str, float]]:
        """Each session's advisor settings (``stuck_after``, ``window``, seconds) by session id,
        as writer.start_session kept them; a session written before they were kept, or whose
        value is not a sane number, has none (the defaults judge it). Only the names Advisor and
        Session take (``stuck_after``, ``window``; the advisor's with ``_s``) are kept."""
        out: dict[int, dict[str, float]] = {}
        for k, v in self.meta.items():
            if not (isinstance(k, str) and k.startswith(JUDGING_PREFIX) and k[len(JUDGING_PREFIX):].isdigit()):
                continue
            try:
                got = json.loads(codec.clean_text(v, 200))
            except (TypeError, ValueError):
                continue
            if isinstance(got, dict):
                out[int(k[len(JUDGING_PREFIX):])] = {
                    name: float(x) for name, x in got.items()
                    if name in ("stuck_after", "window") and isinstance(x, (int, float)) and 0 < x <= 366 * 86400}
        return out

    def advisor_fingerprints(self) -> dict[int, str]:
        """Each session's advisor fingerprint (writer.start_session), by session id; a session
        written before they were kept has none."""
        out = {}
        for k, v in self.meta.items():
            if k.startswith(ADVISOR_PREFIX) and k[len(ADVISOR_PREFIX):].isdigit():
                out[int(k[len(ADVISOR_PREFIX):])] = codec.clean_text(v, 64)
        return out

    def session_list(self) -> list[dict[str, Any]]:
        """Every recording session (``record --append`` adds one) with its span and its target:
        what `info` and `report` say of each (``sessions.session_spans``)."""
        spans = session_spans(self.sessions, self.start_ts, self.end_ts)
        return [{"session": k + 1, "start": st, "end": e, "duration_s": max(0.0, e - st),
                 "target_pid": s["target_pid"], "target_cmdline": s["target_cmdline"], "mode": s["mode"],
                 "closed": s["id"] not in self.unclosed_sessions}
                for k, (s, (st, e)) in enumerate(zip(self.sessions, spans))]

    def describe(self, counts: bool = True) -> dict[str, Any]:
        sysinfo = self.system_info()
        gpus = self.gpu_infos()
        indices = sorted({g.index for g in gpus} | set(self.gpu_indices()))
        last = self.sessions[-1] if self.sessions else {}
        hours = self.duration / 3600.0
        size = self.size_bytes()
        return {
            "path": str(self.path),
            "size_bytes": size,
            "schema_version": self.schema_version,
            "created_by": codec.clean_text(self.meta.get("created_by", "")),
            "host": (sysinfo.hostname if sysinfo and sysinfo.hostname else None) or last.get("host"),
            "driver": sysinfo.driver_version if sysinfo else None,
            "cuda": sysinfo.cuda_driver_version if sysinfo else None,
            "source": sysinfo.source if sysinfo else last.get("mode"),
            "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "memory_total": g.memory_total} for g in gpus],
            "gpu_indices": indices,
            # None below MIN_RATE_SPAN_S: too short a recording to extrapolate from.
            "bytes_per_gpu_hour": (round(size / (hours * len(indices)))
                                   if self.duration >= MIN_RATE_SPAN_S and indices else None),
            "rate_min_s": MIN_RATE_SPAN_S,
            "start": self.start_ts,
            "end": self.end_ts,
            "duration_s": self.duration,
            "backfill_s": round(self.span.backfill_s, 1),
            "sessions": len(self.sessions),
            # Each session's span and target (the two keys below are the last session's).
            "session_list": self.session_list(),
            "target_pid": last.get("target_pid"),
            "target_cmdline": last.get("target_cmdline"),
            "argv": last.get("argv"),
            "gputop_version": last.get("gputop_version"),
            "counts": self.counts() if counts else None,
            "damage": self.damage,
            "state": self.state,
        }

    @property
    def state(self) -> str:
        """``recording`` (a writer has it open now), ``not closed cleanly`` (its recorder was
        killed or the disk filled: what was committed is there), or ``closed``."""
        if self.wal_state == "live":
            return "recording"
        return "not closed cleanly" if self.unclosed_sessions else "closed"


# What info and report say of findings a cut took whole. A replay judges the samples that survived
# again (its Advisor is derived, never read back), so it may show a verdict: said, so that the
# replay and the report do not read as contradicting each other.
LOST_FINDINGS = ("the recorded ones were lost in the cut (the file ends before them); a report or replay judges "
                 "the samples that survived again")

# The tables a stack sample is read from: its row, its stack, that stack's frames, its thread.
STACK_TABLES = ("stack_samples", "stacks", "frames", "threads")


# Every flags byte: (active, owns_gil, category), decoded once.
_FLAGS = {fl: (bool(fl & FLAG_ACTIVE), bool(fl & FLAG_GIL), codec.category_of(fl)) for fl in range(256)}


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _ms(t: float) -> int:
    if t != t:
        return 0
    return math.floor(max(-9e15, min(9e15, t * 1000.0)))


def open_reader(path: str | os.PathLike) -> Reader:
    return Reader(path)


# fold_wal lives in record.opening; importable from here too.
__all__ = ["Reader", "fold_wal", "open_reader"]
