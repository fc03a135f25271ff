"""What a recording's files say before SQLite opens them: whether a file is a recording (or the
``-wal``/``-shm``/``-journal`` beside one), so nothing but a recording is ever written over one,
and the ``-wal`` beside a recording.

A recorder killed before its first checkpoint (older versions checkpointed only on close) left
the main file's header blank and its first page in the WAL. ``wal_page1`` finds the newest copy
of page 1 there, so such a file is still recognised as a recording (and its WAL folded back in).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError
from .schema import APPLICATION_ID, SQLITE_MAGIC

WAL_MAGIC = (0x377F0682, 0x377F0683)
WAL_HEADER = 32
FRAME_HEADER = 24
# Page 1 is rewritten by nearly every commit, so a copy turns up early; a large WAL is scanned
# only this far (the marks never change after the first commit).
MAX_WAL_SCAN = 64 * 1024 * 1024


def wal_page1(data: bytes) -> bytes | None:
    """The newest page-1 image in WAL bytes whose frames carry the WAL's own salt, or None."""
    if len(data) < WAL_HEADER or int.from_bytes(data[0:4], "big") not in WAL_MAGIC:
        return None
    page = int.from_bytes(data[8:12], "big")
    if page < 512 or page > 65536 or page & (page - 1):
        return None
    salt = data[16:24]
    found = None
    off = WAL_HEADER
    while off + FRAME_HEADER + page <= len(data):
        head = data[off : off + FRAME_HEADER]
        if head[8:16] != salt:
            break  # frames from an older WAL generation: no longer part of the database
        if int.from_bytes(head[0:4], "big") == 1:
            found = data[off + FRAME_HEADER : off + FRAME_HEADER + page]
        off += FRAME_HEADER + page
    return found


def wal_page1_head(wal: Path) -> bytes | None:
    """The first 100 bytes (the database header) of page 1 as the WAL at ``wal`` has it."""
    try:
        with open(wal, "rb") as f:
            data = f.read(MAX_WAL_SCAN)
    except OSError:
        return None
    page1 = wal_page1(data)
    return page1[:100] if page1 is not None and len(page1) >= 100 else None


def sidecars(path: Path) -> tuple[Path, Path]:
    return Path(f"{path}-wal"), Path(f"{path}-shm")


def looks_like_recording(path: Path) -> bool | None:
    """True: a gputop recording; False: something else; None: empty (nothing written yet).

    A recording killed before its first checkpoint by an older gputop has its marks only in the
    ``-wal`` beside it: that counts too.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError:
        return False
    if not head:
        return None
    if len(head) < 100 or not head.startswith(SQLITE_MAGIC):
        return False
    if int.from_bytes(head[68:72], "big") == APPLICATION_ID:
        return True
    page1 = wal_page1_head(sidecars(path)[0])
    return page1 is not None and int.from_bytes(page1[68:72], "big") == APPLICATION_ID


_SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal")


def _is_recording_main(path: Path) -> bool:
    if not path.is_file():
        return False  # a device or a pipe (-o /dev/stdout): reading it to look would wait for ever
    kind = looks_like_recording(path)
    if kind is None:  # empty: a recording killed early by an older gputop keeps all of it in its -wal
        page1 = wal_page1_head(sidecars(path)[0])
        return page1 is not None and int.from_bytes(page1[68:72], "big") == APPLICATION_ID
    return kind


def holds_recording(path: Path) -> bool:
    """Whether writing anything but a recording at ``path`` would destroy (part of) one: the
    file is a recording (by its content, whatever its name; through a link too), an empty main
    file whose recording is all in its ``-wal``, or the ``-wal``/``-shm``/``-journal`` beside a
    recording (whether it exists or not: SQLite would take a file of that name for its own)."""
    if _recording_beside(path) is not None:
        return True
    return (path.exists() or path.is_symlink()) and _is_recording_main(path)


def _recording_beside(path: Path) -> Path | None:
    """The recording whose ``-wal``/``-shm``/``-journal`` ``path`` is named as, or None."""
    name = str(path)
    for suffix in _SIDECAR_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            main = Path(name[: -len(suffix)])
            if main.is_file() and _is_recording_main(main):
                return main
    return None


def refuse_overwriting_recording(out: Path, reading: Path | None = None) -> None:
    """For every command whose output is not a recording (``report -o``): never write over the
    recording being read (the same file by another name or link too), nor over any other one,
    nor beside one under its ``-wal``/``-shm``/``-journal`` name, whatever ``--force`` says.
    Raises UserError (one line)."""
    try:
        beside = _recording_beside(out)
        if beside is not None:
            raise UserError(f"{out} is the {str(out)[len(str(beside)):]} file of the gputop recording {beside}: "
                            "not writing there; write the output to another file")
        if not (out.exists() or out.is_symlink()):
            return
        same = reading is not None and out.exists() and reading.exists() and os.path.samefile(out, reading)
        ours = same or _is_recording_main(out)
    except OSError:
        return  # cannot be looked at: the write itself will say why it fails
    if same:
        raise UserError(f"{out} is the recording being read: not overwriting it (--force or not); "
                        "write the output to another file")
    if ours:
        raise UserError(f"{out} is a gputop recording: not overwriting it (--force or not); "
                        "write the output to another file")
