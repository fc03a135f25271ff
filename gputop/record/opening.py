"""Opening a recording for reading: the checks that refuse with one line each, folding a
``-wal`` left beside it, and salvaging a copy cut short so that what survived can be read.

The checks, in order: the file exists, is SQLite, is a gputop recording (``application_id``),
and its schema is not newer than this version reads. A file shorter than its header says (a
truncated copy, a full disk) is read from a private copy that SQLite accepts; ``OpenFacts``
says what was found. Nothing but a gputop recording is ever written to.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError, os_reason
from .files import wal_page1_head
from .schema import APPLICATION_ID, OPEN_SESSION_PREFIX, SCHEMA_VERSION, SQLITE_MAGIC


@dataclass
class OpenFacts:
    """What opening a recording found, besides its connection."""

    schema_version: int = 0
    wal_state: str = "none"  # fold_wal's answer
    tmp: tempfile.TemporaryDirectory | None = None  # the private copy a cut file is read from
    cut: str | None = None  # "truncated (N of M bytes)" for a cut copy
    damage: str | None = None
    lost_tables: list[str] = field(default_factory=list)  # tables a cut copy lost, whole or in part
    partly_tables: list[str] = field(default_factory=list)  # of those, the ones with rows before the cut


def open_recording(path: Path) -> tuple[sqlite3.Connection, OpenFacts]:
    """Open ``path`` read-only after the module's checks; UserError (one line) for each refusal."""
    found = OpenFacts()
    p = path
    if not p.exists():
        raise UserError(f"{p}: no such file")
    if p.is_dir():
        raise UserError(f"{p} is a directory, not a gputop recording")
    if not p.is_file():
        # A FIFO, a socket, a device or a process substitution: reading one would wait for a
        # writer forever (or read a stream SQLite cannot seek in).
        raise UserError(f"{p} is not a regular file (a pipe, socket or device): a recording is a file; "
                        "copy it to one first")
    try:
        with open(p, "rb") as f:
            head = f.read(100)
    except OSError as exc:
        raise UserError(f"cannot read {p}: {os_reason(exc)}") from None
    wal = Path(f"{p}-wal")
    if not head and not wal.exists():
        raise UserError(f"{p} is empty: not a gputop recording")
    if head and not head.startswith(SQLITE_MAGIC):
        raise UserError(f"{p} is not a gputop recording")
    found.wal_state = fold_wal(p)
    try:
        conn, app_id, version = _connect_ro(p)
    except sqlite3.DatabaseError as exc:
        # SQLite refuses a file shorter than its header says (a copy cut short, a full
        # disk): read a private copy whose header lets it use what is there.
        try:
            conn, app_id, version = _open_truncated(found, p, head)
        except (sqlite3.DatabaseError, OSError):
            raise UserError(f"{p} is not a gputop recording or is damaged beyond reading ({exc})") from None
    if app_id != APPLICATION_ID:
        conn.close()
        raise UserError(f"{p} is not a gputop recording")
    if version > SCHEMA_VERSION:
        conn.close()
        raise UserError(
            f"{p} was written by a newer gputop (schema {version}; this version reads up to "
            f"{SCHEMA_VERSION}): upgrade gputop to read it"
        )
    if version < 1:
        conn.close()
        raise UserError(f"{p} is not a gputop recording (no schema version)")
    found.schema_version = version
    return conn, found


def _open_truncated(found: OpenFacts, p: Path, head: bytes) -> tuple[sqlite3.Connection, int, int]:
    if len(head) < 100 or int.from_bytes(head[68:72], "big") != APPLICATION_ID:
        raise sqlite3.DatabaseError("not a recording")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    declared = int.from_bytes(head[28:32], "big") * page
    actual = p.stat().st_size
    found.tmp = tempfile.TemporaryDirectory(prefix="gputop-")
    copy = Path(found.tmp.name) / "recovered.gputop"
    fd = os.open(copy, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with open(p, "rb") as src, os.fdopen(fd, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
        # "version-valid-for" (offset 92) unequal to the change counter (offset 24) makes
        # SQLite size the database from the file instead of trusting the header.
        dst.seek(92)
        dst.write((int.from_bytes(head[24:28], "big") + 1 & 0xFFFFFFFF).to_bytes(4, "big"))
    wal = Path(f"{p}-wal")
    if wal.exists():
        shutil.copyfile(wal, Path(f"{copy}-wal"))
    lost = _salvage(copy, page, declared, actual)
    conn, app_id, version = _connect_ro(copy)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    # A table whose root page survived can still have rows on pages past the cut: walking it
    # says so (only for a damaged file, once, at open).
    partly = []
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        if name in lost:
            continue
        try:
            conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()
        except sqlite3.DatabaseError:
            partly.append(name)
    cut = f" ({actual:,} of {declared:,} bytes)" if declared > actual else ""
    found.cut = f"truncated{cut}"
    found.damage = damage_text(p, cut, lost, partly)
    found.lost_tables = lost + partly
    found.partly_tables = partly
    return conn, app_id, version


def damage_text(p: Path, cut: str, lost: list[str], partly: list[str]) -> str:
    """The one line that says what a cut took (``cut``: " (N of M bytes)" or ''): the tables lost
    whole, those lost past the cut."""
    gone = f"; lost with the cut: {', '.join(lost)}" if lost else ""
    if partly:
        gone += f"; partly lost (rows past the cut): {', '.join(partly)}"
    return f"{p} is truncated or damaged{cut}{gone}"


def _salvage(copy: Path, page: int, declared: int, actual: int) -> list[str]:
    """Make a private copy of a cut file readable table by table; returns the tables lost.

    SQLite refuses a whole schema that names a page past the end of the file. The copy is padded
    back to its declared size; every table or index whose first (root) page was cut off gets an
    empty page of its kind there, so it reads as empty instead of failing the file, while pages
    that survived read as before (a cut inside a table stops that table's reads at the cut,
    which ``Reader._rows`` handles). Indexes only speed queries up and may have lost pages their table
    kept: they are dropped, so queries scan the rows that are really there.
    """
    present = actual // page  # pages 1..present are whole
    with open(copy, "r+b") as f:
        f.truncate(max(declared, actual))
    c = sqlite3.connect(str(copy), isolation_level=None)
    try:
        objects = c.execute("SELECT type, name, rootpage, sql FROM sqlite_master WHERE rootpage > 0").fetchall()
    finally:
        c.close()
    lost = []
    with open(copy, "r+b") as f:
        for kind, name, root, _sql in objects:
            if not isinstance(root, int) or root <= present:
                continue
            empty = bytearray(page)
            empty[0] = 0x0D if kind == "table" else 0x0A  # leaf page of a table / of an index
            empty[5:7] = (page % 65536).to_bytes(2, "big")  # cell content starts at the end: none
            f.seek((root - 1) * page)
            f.write(empty)
            if kind == "table":
                lost.append(str(name))
    c = sqlite3.connect(str(copy), isolation_level=None)
    try:
        for kind, name, _root, sql in objects:
            if kind == "index" and sql:
                try:
                    c.execute(f'DROP INDEX IF EXISTS "{name}"')
                except sqlite3.DatabaseError:
                    pass
    finally:
        c.close()
    return lost


def fold_wal(p: Path) -> str:
    """Fold a ``-wal`` left beside a recording back into it, when no writer has it open.

    Returns ``"none"`` (no WAL), ``"folded"`` (the file is one self-contained file again),
    ``"live"`` (a writer has it open: it is being recorded now), or ``"read-only"`` (the WAL is
    read through but cannot be folded here). Nothing but a gputop recording is ever written to.
    """
    wal = Path(f"{p}-wal")
    try:
        with open(p, "rb") as f:
            head = f.read(100)
    except OSError:
        return "read-only"
    # Header bytes 18-19 are 2 in WAL mode. A writer that closes switches its file back to
    # rollback mode, so a WAL-mode file with no -wal is the main file of an unclosed recording
    # (copied alone, or its -wal lost): folding it stops readers leaving -wal/-shm beside it.
    wal_mode = len(head) >= 20 and 2 in (head[18], head[19])
    if not wal.exists() and not wal_mode:
        return "none"
    if not (os.access(p, os.W_OK) and os.access(p.parent, os.W_OK) and (not wal.exists() or os.access(wal, os.W_OK))):
        return "read-only"
    page1 = head if int.from_bytes(head[68:72], "big") == APPLICATION_ID else wal_page1_head(wal)
    if page1 is None or not head.startswith(SQLITE_MAGIC) or int.from_bytes(page1[68:72], "big") != APPLICATION_ID:
        return "none"
    try:
        conn = sqlite3.connect(str(p), isolation_level=None, check_same_thread=False, timeout=0.2)
    except sqlite3.Error:
        return "read-only"
    try:
        if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            return "none"
        # Leaving WAL mode needs the only connection to the file: it fails while a recorder
        # writes it, which is how a live recording is told from an abandoned one.
        mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
        if str(mode).lower() != "delete":
            return "live"
        # A recorder of a version that did not mark its sessions: its last session is the one
        # the WAL was left behind by.
        marked = conn.execute("SELECT count(*) FROM meta WHERE key LIKE ?", (OPEN_SESSION_PREFIX + "%",)).fetchone()[0]
        last = conn.execute("SELECT max(id) FROM sessions").fetchone()[0]
        if not marked and isinstance(last, int):
            conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)",
                         (f"{OPEN_SESSION_PREFIX}{last}", repr(time.time())))
        return "folded"
    except sqlite3.OperationalError as exc:
        # Locked or busy: a recorder has it open. Anything else (the disk is full, so the WAL
        # cannot be copied back) leaves it unfolded but not "being recorded".
        why = str(exc).lower()
        return "live" if "lock" in why or "busy" in why else "read-only"
    except sqlite3.DatabaseError:
        return "read-only"
    finally:
        conn.close()


def _connect_ro(p: Path) -> tuple[sqlite3.Connection, int, int]:
    conn = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn, app_id, version


__all__ = ["OpenFacts", "fold_wal", "open_recording"]
