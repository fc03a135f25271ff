"""Which blocks of a damaged recording can be read: one list per series that every reader of
the file (``info``'s counts, the span, the replay's reads, the report's) goes by, so that they
agree on what survived.

A cut copy (or a file with bad pages) keeps some of a table's pages and not others. SQLite
answers a query until it meets a missing page, so each kind of query stopped somewhere else: a
sum of the blocks' sizes failed outright (``info`` said 0 polls, or counted blocks whose data
was gone), a query for the newest block failed and with it the whole series' span (a replay
then started and ended at one instant and showed "waiting for first sample"), while a time
range read the blocks up to the cut. Here the blocks' keys are read once in time order, past a
missing page by looking up the next key beyond it, and a block counts only if its data decodes.
"""

from __future__ import annotations

import sqlite3
from typing import Callable, Iterator

# After a missing page, the next key is looked for this far on (in ms) until one reads: no block
# is keyed closer to its successor than a flush, so a step this small skips none that survived
# whole (see schema.FLUSH_BLOCK_MAX_S: a flush's block spans at most that).
PROBE_STEP_MS = 10_000


def readable_keys(conn: sqlite3.Connection, table: str, until_ms: int) -> list[tuple[int, int]]:
    """(ts_ms, n) of every row of ``table`` whose key can be read, in key order; ``until_ms``:
    how far to look past a missing page (the recording's end)."""
    out: list[tuple[int, int]] = []
    after: int | None = None
    while True:
        try:
            for key, n in _rows_after(conn, table, after):
                if not isinstance(key, int) or (after is not None and key <= after) or key > until_ms:
                    # A page that is not what it claims (zeros where the cut was) can read as
                    # rows out of order: damage, like a page SQLite refuses.
                    raise sqlite3.DatabaseError(f"{table}: row out of order")
                out.append((key, n))
                after = key
            return out
        except sqlite3.DatabaseError:
            pass
        # A missing page: find the next key that can be read, a step at a time.
        bound = (after if after is not None else _first_key_bound(conn, table))
        if bound is None:
            return out
        while True:
            bound += PROBE_STEP_MS
            if bound > until_ms:
                return out
            try:
                row = conn.execute(f"SELECT ts_ms FROM {table} WHERE ts_ms > ? ORDER BY ts_ms LIMIT 1",
                                   (bound,)).fetchone()
            except sqlite3.DatabaseError:
                continue
            if row is None:
                return out
            if not isinstance(row[0], int) or row[0] <= bound:
                # A damaged page can answer with a key behind the one asked past: taking it
                # would send the search back to where it was, for ever. Step on instead.
                continue
            after = row[0] - 1
            break


def _rows_after(conn: sqlite3.Connection, table: str, after: int | None) -> Iterator[tuple]:
    if after is None:
        return conn.execute(f"SELECT ts_ms, n FROM {table} ORDER BY ts_ms")
    return conn.execute(f"SELECT ts_ms, n FROM {table} WHERE ts_ms > ? ORDER BY ts_ms", (after,))


# How long before a session's start its first block may be keyed: NVML's utilisation buffer,
# read whole by the first poll, reaches ~20 s back (see span.py); a minute is ample.
BEFORE_START_MS = 60_000


def _first_key_bound(conn: sqlite3.Connection, table: str) -> int | None:
    """Where to start looking when even the first page is missing: before the earliest session's
    start by as much as a block can be keyed before it."""
    try:
        row = conn.execute("SELECT min(started) FROM sessions").fetchone()
    except sqlite3.DatabaseError:
        return None
    started = row[0] if row else None
    if not isinstance(started, (int, float)):
        return None
    return int(started * 1000) - BEFORE_START_MS


class SalvagedSeries:
    """One series of a damaged file: its readable blocks, and which of them decode."""

    def __init__(self, keys: list[tuple[int, int]], decode: Callable[[int, int], list[tuple]]) -> None:
        self.keys = keys
        self._decode = decode  # (ts_ms, n) -> the block's rows, [] when they cannot be read
        self._good: dict[int, bool] = {}

    def decodes(self, key: int, n: int) -> bool:
        ok = self._good.get(key)
        if ok is None:
            ok = self._good[key] = bool(self._decode(key, n))
        return ok

    def span(self) -> tuple[float | None, float | None]:
        """The first and last timestamps of the blocks that decode."""
        first = next((self._decode(k, n)[0][0] for k, n in self.keys if self.decodes(k, n)), None)
        last = next((self._decode(k, n)[-1][0] for k, n in reversed(self.keys) if self.decodes(k, n)), None)
        return first, last

    def count(self) -> int:
        """Samples in the blocks that decode: what a read of the whole series returns."""
        return sum(n for k, n in self.keys if isinstance(n, int) and self.decodes(k, n))

    def between(self, lo_ms: int, hi_ms: int) -> list[tuple[int, int]]:
        """The readable blocks keyed in (lo_ms, hi_ms]."""
        return [(k, n) for k, n in self.keys if lo_ms < k <= hi_ms]


__all__ = ["PROBE_STEP_MS", "SalvagedSeries", "readable_keys"]
