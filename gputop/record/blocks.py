"""Packing rows of integers into compact blobs: the storage of every sample series.

A block is ``n`` rows of the same layout, stored column by column:

- ``t`` columns hold timestamps *exactly*: the IEEE-754 bits of the float as an integer, as
  differences from the previous row. Two timestamps a second apart differ by a few million
  units in the last place, so each costs 3-4 bytes before compression and nothing is rounded
  (the store matches a GPU-process snapshot to its poll by exact time).
- ``i`` columns hold integers or ``None``. The encoder keeps the first value aside and stores
  differences when that needs a smaller integer type (slowly varying memory counters, ids),
  plain values otherwise, in the smallest of int8..int64 that fits; ``None``s get a mask.
- ``y`` columns hold short byte strings (per-core CPU times) as lengths plus concatenation.

The whole body is zlib-compressed when that is smaller. Decoding is bounded (a crafted blob
cannot inflate past what its row count allows) and raises ``ValueError`` for anything malformed.

Blocks a flush writes live only until their minute is merged, so they take the cheap road:
``pack_rows_json`` stores the rows as JSON (C-speed to write, ~20 times cheaper than packing),
and the merge packs the minute once. Readers accept both.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import zlib
from array import array
from itertools import accumulate
from typing import Sequence

CODEC_RAW = 0
CODEC_ZLIB = 1
CODEC_JSON = 2
# zlib's default level: a block is compressed once (when a minute is compacted), so the few
# hundred microseconds it costs do not matter; higher levels gain ~1 % here.
ZLIB_LEVEL = 6
# Upper bound on decoded bytes per row and column (an int64 plus mask, or a short byte string),
# used to cap decompression of untrusted data.
_MAX_BYTES_PER_CELL = 80
MAX_ROWS = 1_000_000

_LITTLE = sys.byteorder == "little"
_TYPES = ("B", "H", "I", "Q", "b", "h", "i", "q")
_RANGES = (
    ("B", 0, 0xFF),
    ("H", 0, 0xFFFF),
    ("I", 0, 0xFFFFFFFF),
    ("Q", 0, 0xFFFFFFFFFFFFFFFF),
    ("b", -0x80, 0x7F),
    ("h", -0x8000, 0x7FFF),
    ("i", -0x80000000, 0x7FFFFFFF),
    ("q", -0x8000000000000000, 0x7FFFFFFFFFFFFFFF),
)
_SIZES = {"B": 1, "H": 2, "I": 4, "Q": 8, "b": 1, "h": 2, "i": 4, "q": 8}
_F_NULLS = 0x10
_F_DELTA = 0x20
_D = struct.Struct("<d")
_Q = struct.Struct("<q")


def float_bits(x: float) -> int:
    return _Q.unpack(_D.pack(x))[0]


def bits_float(b: int) -> float:
    return _D.unpack(_Q.pack(b))[0]


def _smallest(lo: int, hi: int) -> str:
    for code, a, b in _RANGES:
        if a <= lo and hi <= b:
            return code
    raise ValueError("integer out of range")


def _to_bytes(code: str, values: Sequence[int]) -> bytes:
    a = array(code, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _encode_ints(values: list[int | None], out: bytearray) -> None:
    flags = 0
    mask = b""
    if any(v is None for v in values):
        flags |= _F_NULLS
        mask = bytes(0 if v is None else 1 for v in values)
        vals = [0 if v is None else int(v) for v in values]  # type: ignore[arg-type]
    else:
        vals = [int(v) for v in values]  # type: ignore[arg-type]
    base = vals[0] if vals else 0
    plain = _smallest(min(vals), max(vals)) if vals else "B"
    diffs = [b - a for a, b in zip(vals, vals[1:])]
    delta = _smallest(min(diffs), max(diffs)) if diffs else "B"
    if _SIZES[delta] < _SIZES[plain]:
        flags |= _F_DELTA
        out.append(flags | _TYPES.index(delta))
        out += mask
        out += _Q.pack(base)
        out += _to_bytes(delta, diffs)
    else:
        out.append(flags | _TYPES.index(plain))
        out += mask
        out += _to_bytes(plain, vals)


def pack_rows(rows: Sequence[Sequence[object]], layout: str) -> bytes:
    """``layout``: one letter per column, ``t`` / ``i`` / ``y`` (see the module docstring)."""
    raw = bytearray()
    for c, kind in enumerate(layout):
        col = [r[c] for r in rows]
        if kind == "t":
            _encode_ints([float_bits(float(v)) for v in col], raw)  # type: ignore[arg-type]
        elif kind == "i":
            _encode_ints(col, raw)  # type: ignore[arg-type]
        elif kind == "y":
            blobs = [b"" if v is None else bytes(v) for v in col]  # type: ignore[arg-type]
            _encode_ints([len(b) for b in blobs], raw)
            raw += b"".join(blobs)
        else:
            raise ValueError(f"unknown column kind {kind!r}")
    packed = zlib.compress(bytes(raw), ZLIB_LEVEL)
    if len(packed) < len(raw):
        return bytes([CODEC_ZLIB]) + packed
    return bytes([CODEC_RAW]) + bytes(raw)


def pack_rows_json(rows: Sequence[Sequence[object]], layout: str) -> bytes:
    """The flush-time form: JSON rows, byte strings as hex. Timestamps survive exactly (JSON
    floats round-trip through ``repr``)."""
    ys = [i for i, k in enumerate(layout) if k == "y"]
    if ys:
        rows = [[(v.hex() if isinstance(v, (bytes, bytearray)) else v) if i in ys else v for i, v in enumerate(r)]
                for r in rows]
    return bytes([CODEC_JSON]) + json.dumps(rows, separators=(",", ":"), allow_nan=False).encode()


_INT64 = (-(2**63), 2**63 - 1)


def _rows_from_json(body: bytes, layout: str, n: int) -> list[tuple]:
    if len(body) > _MAX_BYTES_PER_CELL * (n + 1) * len(layout) + 1024:
        raise ValueError("block larger than its row count allows")
    try:
        rows = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("corrupt block") from None
    if not isinstance(rows, list) or len(rows) != n:
        raise ValueError("bad block")
    out = []
    for r in rows:
        if not isinstance(r, list) or len(r) != len(layout):
            raise ValueError("bad block row")
        vals: list[object] = []
        for kind, v in zip(layout, r):
            if kind == "t":
                if type(v) not in (float, int) or not math.isfinite(v):
                    raise ValueError("bad timestamp")
                vals.append(float(v))
            elif kind == "i":
                if v is not None and (type(v) is not int or not _INT64[0] <= v <= _INT64[1]):
                    raise ValueError("bad integer")
                vals.append(v)
            else:
                if v is None:
                    vals.append(b"")
                elif isinstance(v, str):
                    vals.append(bytes.fromhex(v))
                else:
                    raise ValueError("bad bytes")
        out.append(tuple(vals))
    return out


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError("truncated block")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b


def _decode_ints(cur: _Cursor, n: int) -> list:
    head = cur.take(1)[0]
    t = head & 0x0F
    if t >= len(_TYPES) or head & ~0x3F:
        raise ValueError("bad column header")
    mask = cur.take(n) if head & _F_NULLS else None
    code = _TYPES[t]
    if head & _F_DELTA:
        base = _Q.unpack(cur.take(8))[0]
        m = max(0, n - 1)
        a = array(code)
        a.frombytes(cur.take(_SIZES[code] * m))
        if not _LITTLE:
            a.byteswap()
        vals = list(accumulate(a, initial=base)) if n else []
    else:
        a = array(code)
        a.frombytes(cur.take(_SIZES[code] * n))
        if not _LITTLE:
            a.byteswap()
        vals = a.tolist()
    if mask is not None:
        vals = [v if m else None for v, m in zip(vals, mask)]
    return vals


def unpack_rows(data: object, layout: str, n: int) -> list[tuple]:
    """Inverse of ``pack_rows``: ``n`` row tuples. Raises ValueError on anything malformed."""
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise ValueError("missing block")
    if not 0 <= n <= MAX_ROWS:
        raise ValueError("bad row count")
    codec, body = data[0], bytes(data[1:])
    if codec == CODEC_JSON:
        return _rows_from_json(body, layout, n)
    if codec == CODEC_ZLIB:
        limit = _MAX_BYTES_PER_CELL * (n + 1) * len(layout) + 1024
        try:
            d = zlib.decompressobj()
            body = d.decompress(body, limit)
        except zlib.error as exc:
            raise ValueError(f"corrupt block: {exc}") from None
        if d.unconsumed_tail:
            raise ValueError("block larger than its row count allows")
    elif codec != CODEC_RAW:
        raise ValueError(f"unknown block codec {codec}")
    cur = _Cursor(body)
    cols: list[list] = []
    for kind in layout:
        if kind == "t":
            bits = _decode_ints(cur, n)
            if None in bits:
                raise ValueError("missing timestamp")
            try:
                # Reinterpret the int64 bit patterns as doubles in one go.
                cols.append(array("d", array("q", bits).tobytes()).tolist())
            except OverflowError:
                raise ValueError("bad timestamp") from None
        elif kind == "i":
            cols.append(_decode_ints(cur, n))
        elif kind == "y":
            lens = _decode_ints(cur, n)
            out = []
            for ln in lens:
                out.append(cur.take(ln or 0))
            cols.append(out)
        else:
            raise ValueError(f"unknown column kind {kind!r}")
    if cur.pos != len(body):
        raise ValueError("block has trailing bytes")
    return list(zip(*cols)) if cols else []
