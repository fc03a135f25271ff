"""What a recording's files say before SQLite opens them: the ``-wal`` beside a recording.

A recorder killed before its first checkpoint (older versions checkpointed only on close) left
the main file's header blank and its first page in the WAL. ``wal_page1`` finds the newest copy
of page 1 there, so such a file is still recognised as a recording (and its WAL folded back in).
"""

from __future__ import annotations

from pathlib import Path

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
