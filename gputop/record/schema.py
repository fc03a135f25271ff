"""The recording file format: one SQLite database per session.

- Every sample series (GPU polls, NVML's 200 ms utilisation buffer, GPU processes, host,
  processes, stack samples) lives in its own table of *blocks*: one row holds the samples of a
  stretch of time, packed column by column (``blocks``), keyed by its first timestamp in
  milliseconds (``ts_ms``), with its last timestamp (``t1``) beside it. The writer commits a small block per flush (~0.5 s, so a killed
  recorder loses at most that) and, once a minute has passed, merges that minute's small blocks
  into one (``BLOCK_S``), which compresses well: a day of one GPU at default rates is a few
  tens of MB. A time query reads only the blocks that overlap it.
- What repeats is stored once and referenced by id: stack frames, stacks (tuples of frame ids),
  threads, process identities (command line, environment) and short strings (process status).
- Static info, sessions, events, findings and the overview are plain tables, readable with the
  ``sqlite3`` shell.
- ``application_id`` marks the file as a gputop recording; ``user_version`` is the schema
  version. A reader refuses a newer version rather than misreading it.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass

from ..model import Category, Severity

# 'gpTR' as a big-endian int: how the reader (and `file`-like tools) recognise the file.
APPLICATION_ID = 0x67705452
# Bumped only when an older gputop would misread a file (it refuses a newer version). A column
# added at the end of a plain table is not that: older readers name the columns they select, and
# this one checks for the column (see FINDINGS_OPTIONAL). So `findings.gain_predicted` (added
# later) left the version at 1, and files from before it still read, with gain_predicted None.
# A column added to a series' blocks is: an older reader decodes every block with the layout it
# knows, so a wider block reads as damage. Version 2 added the GPU samples' NVLink rates
# (GpuSample.nvlink_tx_bps / nvlink_rx_bps, after `error`) and, in the same unreleased cycle, the
# workers' private memory (ProcSample.uss / pss, after `io_write_bps`): this gputop reads version 1
# files with the narrower layouts (those fields None) and appends to one in them, so it stays
# version 1.
# Version 4 added the GPU samples' FP64 readings (GpuSample.dfma_active / fp64_active, after the
# NVLink rates): a model in float64 runs its matmuls on the FP64 tensor cores, which GPM's
# any-tensor reading cannot tell from bf16's.
SCHEMA_VERSION = 4
# The versions this gputop appends to, each in its own layout (see series_layouts).
APPENDABLE_VERSIONS = (1, 2, 3, 4)
FORMAT_NAME = "gputop-recording"
SQLITE_MAGIC = b"SQLite format 3\x00"

# A minute per compacted block: ~60 GPU polls or ~1,200 stack samples, large enough for zlib
# to find the repetition, small enough that a seek decodes little it does not need.
BLOCK_S = 60.0
# A flush's block is split so that it never spans more than this (a writer that stalled
# catches up in several blocks).
FLUSH_BLOCK_MAX_S = 10.0
# No block spans more than this (a minute's merge plus the last flush reaching past it), so a
# query for (t0, t1] only looks at blocks keyed after t0 - MAX_BLOCK_SPAN_S.
MAX_BLOCK_SPAN_S = BLOCK_S + FLUSH_BLOCK_MAX_S + 5.0
# Overview buckets: the timeline and the report read these instead of a day of raw samples.
# 10 s gives 8,640 buckets a day: enough for a scrubber a few hundred cells wide.
OVERVIEW_BUCKET_S = 10.0

# Stable codes for enums stored as integers. Never renumber: add at the end.
CATEGORY_CODES: tuple[Category, ...] = (
    Category.OTHER,
    Category.DATA_WAIT,
    Category.DATA_FETCH,
    Category.HOST_SYNC,
    Category.H2D_COPY,
    Category.FORWARD,
    Category.BACKWARD,
    Category.OPTIMIZER,
    Category.COLLECTIVE,
    Category.CHECKPOINT_IO,
    Category.GC,
    Category.IDLE,
)
CATEGORY_TO_CODE = {c: i for i, c in enumerate(CATEGORY_CODES)}
SEVERITIES = {s.value: s for s in Severity}

# Flags of a stack sample: bit 0 active, bit 1 owns the GIL, bits 2.. category code.
FLAG_ACTIVE = 0x1
FLAG_GIL = 0x2
CATEGORY_SHIFT = 2


@dataclass(frozen=True)
class Field:
    """How a model field becomes an integer in a block.

    kind ``f``: a float kept as ``round(value * scale)`` (resolution 1/scale); ``i``: an int;
    ``s``: a string, stored as an id in ``strings``. ``None`` stays ``None``.
    """

    name: str
    kind: str = "f"
    scale: int = 100


# GpuSample after (ts, index). Percentages and temperatures to 0.01, power to 1 mW, rates to
# 1 byte/s: finer than any display or rule needs.
GPU_FIELDS: tuple[Field, ...] = (
    Field("util_gpu"),
    Field("util_mem"),
    Field("mem_used", "i"),
    Field("mem_total", "i"),
    Field("temperature_c"),
    Field("power_w", "f", 1000),
    Field("power_limit_w", "f", 1000),
    Field("fan_pct"),
    Field("sm_clock_mhz", "i"),
    Field("mem_clock_mhz", "i"),
    Field("sm_clock_max_mhz", "i"),
    Field("throttle_reasons", "i"),
    Field("pcie_gen", "i"),
    Field("pcie_width", "i"),
    Field("pcie_max_gen", "i"),
    Field("pcie_max_width", "i"),
    Field("pcie_rx_bps", "f", 1),
    Field("pcie_tx_bps", "f", 1),
    Field("ecc_corrected", "i"),
    Field("ecc_uncorrected", "i"),
    Field("sm_active"),
    Field("sm_occupancy"),
    Field("tensor_active"),
    Field("dram_active"),
    Field("fp32_active"),
    Field("fp16_active"),
    Field("error", "s"),
    Field("nvlink_tx_bps", "f", 1),
    Field("nvlink_rx_bps", "f", 1),
    Field("dfma_active"),
    Field("fp64_active"),
)
# The GPU fields a version 1 file holds: every field of version 2 before the NVLink rates; a
# version 2 or 3 file's, every field before the FP64 readings.
GPU_FIELDS_V3 = GPU_FIELDS[: len(GPU_FIELDS) - 2]
GPU_FIELDS_V1 = GPU_FIELDS_V3[: len(GPU_FIELDS_V3) - 2]

# HostSample after ts; the per-core times follow as one byte string (see pack_cores).
HOST_FIELDS: tuple[Field, ...] = (
    Field("cpu_percent"),
    Field("iowait_percent"),
    Field("steal_percent"),
    Field("load1"),
    Field("load5"),
    Field("load15"),
    Field("mem_total", "i"),
    Field("mem_used", "i"),
    Field("mem_available", "i"),
    Field("swap_total", "i"),
    Field("swap_used", "i"),
    Field("disk_read_bps", "f", 1),
    Field("disk_write_bps", "f", 1),
    Field("net_rx_bps", "f", 1),
    Field("net_tx_bps", "f", 1),
    Field("shm_total", "i"),
    Field("shm_used", "i"),
    Field("cgroup_limit", "i"),
    Field("cgroup_used", "i"),
)
# The host fields a file before version 3 holds: every field before the job's cgroup memory.
HOST_FIELDS_V2 = HOST_FIELDS[: len(HOST_FIELDS) - 2]

GPU_PROC_FIELDS: tuple[Field, ...] = (
    Field("gpu_index", "i"),
    Field("pid", "i"),
    Field("used_memory", "i"),
    Field("sm_util"),
    Field("mem_util"),
    Field("kind", "s"),
)

# ProcSample after (ts, process id in `processes`); identity fields live in `processes`.
PROC_FIELDS: tuple[Field, ...] = (
    Field("cpu_percent"),
    Field("rss", "i"),
    Field("num_threads", "i"),
    Field("status", "s"),
    Field("io_read_bps", "f", 1),
    Field("io_write_bps", "f", 1),
    Field("uss", "i"),
    Field("pss", "i"),
)
# The process fields a version 1 file holds: every field of version 2 before the private memory.
PROC_FIELDS_V1 = PROC_FIELDS[: len(PROC_FIELDS) - 2]
PROC_IDENTITY = ("pid", "ppid", "name", "user", "cmdline", "create_time", "role", "env")

# TaskSample after ts: the process's IO counters and its main thread's /proc reading (the thread
# whose id is the process's). The stuck and IO verdicts read the main thread (its state, the call
# it sleeps in, its wakes); the other threads' readings stay live-only, where ~50 torch threads a
# process would outweigh every other series.
TASK_FIELDS: tuple[Field, ...] = (
    Field("pid", "i"),
    Field("ppid", "i"),
    Field("rchar", "i"),
    Field("wchar", "i"),
    Field("name", "s"),
    Field("state", "s"),
    Field("cpu_ns", "i"),
    Field("runs", "i"),
    Field("wakes", "i"),
    Field("wchan", "s"),
    Field("syscall", "s"),
    Field("fd_path", "s"),
    Field("fs", "s"),
)


@dataclass(frozen=True)
class Series:
    table: str
    layout: str  # blocks layout: one letter per column


# Column layouts (``blocks``): t = timestamp, i = integer, y = bytes.
SERIES: dict[str, Series] = {
    "gpu": Series("gpu_samples", "ti" + "i" * len(GPU_FIELDS)),
    "util": Series("util_points", "tii"),  # ts, gpu, util x100
    "gpu_procs": Series("gpu_processes", "t" + "i" * len(GPU_PROC_FIELDS)),
    "host": Series("host_samples", "t" + "i" * len(HOST_FIELDS) + "y"),
    "procs": Series("proc_samples", "ti" + "i" * len(PROC_FIELDS)),
    "stacks": Series("stack_samples", "tiii"),  # ts, thread id, stack id, flags
    # Added after version 4 without a version bump: a table of its own, which older readers never
    # select; a file from before has none (the reader reads no tasks from it, and an append adds it).
    "tasks": Series("task_samples", "t" + "i" * len(TASK_FIELDS)),
}
SERIES_TABLES = tuple(s.table for s in SERIES.values())


def series_layouts(version: int) -> dict[str, str]:
    """Each series' block layout in a file of schema ``version`` (one layout per file: an
    --append writes the file's own)."""
    layouts = {name: s.layout for name, s in SERIES.items()}
    if version < 4:
        layouts["gpu"] = "ti" + "i" * len(GPU_FIELDS_V3)
    if version < 2:
        layouts["gpu"] = "ti" + "i" * len(GPU_FIELDS_V1)
        layouts["procs"] = "ti" + "i" * len(PROC_FIELDS_V1)
    if version < 3:
        layouts["host"] = "t" + "i" * len(HOST_FIELDS_V2) + "y"
    return layouts

# Model fields stored some other way than a Field entry (checked by a test, so a new model
# field cannot be silently left out of recordings).
STORED_ELSEWHERE = {
    "GpuSample": {"ts", "index"},
    "HostSample": {"ts", "cores"},
    "ProcSample": {"ts"} | set(PROC_IDENTITY),
    "GpuProcess": {"ts"},
}


def _block_table(name: str) -> str:
    # A rowid table keyed by the block's first time in whole milliseconds: SQLite keeps a
    # rowid table's rows of up to ~4 KB inside its leaf pages (an index-organised table would
    # spill anything over ~1 KB into overflow pages), and the key doubles as the time index.
    return (
        f"CREATE TABLE {name} (ts_ms INTEGER PRIMARY KEY, t1 REAL NOT NULL, n INTEGER NOT NULL,"
        f" data BLOB NOT NULL);"
    )


def series_tables_if_missing() -> list[str]:
    """The statements an append runs: a series added since the file was made gets its table (an
    older reader never selects it)."""
    return [_block_table(t).replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1) for t in SERIES_TABLES]


DDL = "\n".join(
    [
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;",
        """CREATE TABLE sessions (
    id INTEGER PRIMARY KEY, started REAL NOT NULL, ended REAL, host TEXT, gputop_version TEXT,
    mode TEXT, argv TEXT, target_pid INTEGER, target_cmdline TEXT, interval REAL
);""",
        "CREATE TABLE strings (id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE);",
        "CREATE TABLE system_info (ts REAL NOT NULL, data TEXT NOT NULL);",
        "CREATE TABLE gpu_info (ts REAL NOT NULL, gpu INTEGER NOT NULL, data TEXT NOT NULL);",
        *(_block_table(t) for t in SERIES_TABLES),
        """CREATE TABLE processes (
    id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, ppid INTEGER, name TEXT, user TEXT,
    cmdline TEXT, create_time REAL, role TEXT, env TEXT
);""",
        """CREATE TABLE frames (
    id INTEGER PRIMARY KEY, name TEXT, filename TEXT, line INTEGER, module TEXT, code TEXT, keeps TEXT
);""",
        "CREATE TABLE stacks (id INTEGER PRIMARY KEY, frames BLOB NOT NULL);",
        """CREATE TABLE threads (
    id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, thread_id INTEGER NOT NULL,
    thread_name TEXT, is_main INTEGER, os_thread_id INTEGER
);""",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, ts REAL NOT NULL, source TEXT, level TEXT, message TEXT);",
        "CREATE INDEX events_ts ON events (ts);",
        """CREATE TABLE findings (
    id INTEGER PRIMARY KEY, ts REAL NOT NULL, last_seen REAL NOT NULL, finding_id TEXT NOT NULL,
    gpu INTEGER, severity TEXT, confidence REAL, title TEXT, evidence TEXT, action TEXT,
    expected_gain TEXT, cost_s REAL, first_seen REAL, gain_predicted REAL
);""",
        "CREATE INDEX findings_ts ON findings (ts);",
        """CREATE TABLE overview (
    ts REAL NOT NULL, gpu INTEGER NOT NULL, span REAL NOT NULL,
    covered_s REAL, busy_s REAL, low_s REAL, util_max REAL, mem_used_max INTEGER, power_avg REAL,
    polls INTEGER,
    PRIMARY KEY (ts, gpu)
) WITHOUT ROWID;""",
    ]
)

# A meta key present from a session's start until its writer closes it: still there when the
# recorder was killed (or the disk filled) and the file was "not closed cleanly".
OPEN_SESSION_PREFIX = "open_session:"


ADVISOR_PREFIX = "advisor."


def advisor_key(session_id: int) -> str:
    """The meta key holding the fingerprint of the advisor that judged a session's findings."""
    return f"{ADVISOR_PREFIX}{session_id}"


# The settings a session's advisor judged with (its stuck threshold, its window), as JSON: a report
# or replay judges the samples again with the same ones, so it reaches the verdict the session
# showed (`advise --stuck-after 6 --record F` called a job stuck that `report F` judged at 30 s).
JUDGING_PREFIX = "judging."


def judging_key(session_id: int) -> str:
    return f"{JUDGING_PREFIX}{session_id}"


def open_session_key(session_id: int) -> str:
    return f"{OPEN_SESSION_PREFIX}{session_id}"


# Tables with a time column, for `info` and the damage probe.
TIME_TABLES = SERIES_TABLES + ("events", "findings")

# `findings` columns that a file from an older gputop (same schema version) may lack: the
# reader selects NULL in their place and the writer leaves them out (see RecordWriter).
FINDINGS_OPTIONAL = ("gain_predicted",)
# `frames.keeps` (Frame.loop and Frame.keeps, JSON {"loop": N, "keeps": [[line, statement], ...]})
# came later too: a file without it
# reads every frame's keeps empty, and an --append adds the column (NULL for the frames before:
# nothing was read of their loops, which is what empty says).
FRAMES_KEEPS = "keeps"


# --------------------------------------------------------------------------- small encodings

# Per-core CPU times in half-percent steps (0..200), one byte each: user, system, iowait, and
# steal only when some core has any. Half a percent is finer than a per-core bar can show; four
# floats per core would make the host series several times larger on a 16-core machine. The
# first byte says how many fields each core has (3 or 4).
CORE_STEP = 0.5


def pack_cores(cores) -> bytes:
    if not cores:
        return b""
    steal = any(c.steal for c in cores)
    out = bytearray([4 if steal else 3])
    for c in cores:
        fields = (c.user, c.system, c.iowait, c.steal) if steal else (c.user, c.system, c.iowait)
        for v in fields:
            out.append(min(255, max(0, round(float(v) / CORE_STEP))))
    return bytes(out)


def unpack_cores(blob: object) -> list[tuple[float, float, float, float]]:
    if not isinstance(blob, (bytes, bytearray)) or not blob or blob[0] not in (3, 4) or (len(blob) - 1) % blob[0]:
        return []
    k = blob[0]
    out = []
    for i in range(1, len(blob), k):
        v = blob[i : i + k]
        out.append((v[0] * CORE_STEP, v[1] * CORE_STEP, v[2] * CORE_STEP, v[3] * CORE_STEP if k == 4 else 0.0))
    return out


def pack_ids(ids) -> bytes:
    """A stack: its frame ids, newest frame first, as little-endian uint32."""
    a = array("I", ids)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def unpack_ids(data: object) -> tuple[int, ...]:
    if not isinstance(data, (bytes, bytearray)) or len(data) % 4:
        raise ValueError("malformed id list")
    a = array("I")
    a.frombytes(bytes(data))
    if sys.byteorder != "little":
        a.byteswap()
    return tuple(a)

# Events that state how things are (not what happened): the multi-rank job's rank map, the GPU
# topology. A recording keeps them however late it starts; a replay and a seek always get the
# newest as of their time.
STATE_EVENT_SOURCES = ("ranks", "topology")
