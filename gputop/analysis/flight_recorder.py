"""PyTorch's flight recorder, read after a hang: which rank did not join which collective. Pure:
plain dicts in (the dumps as unpickled, PyTorch's analyzer's collectives as dicts), a verdict
and its text out. No torch here; the files are read in ``gputop.sources.flight_recorder``.

The recorder (``TORCH_FR_BUFFER_SIZE=N``, older ``TORCH_NCCL_TRACE_BUFFER_SIZE``) keeps each
rank's last N collectives; on a watchdog timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, NCCL) every
rank writes its buffer to ``PREFIX<rank>``, PREFIX from ``TORCH_FR_DUMP_TEMP_FILE`` (older
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), by default ``/tmp/nccl_trace_rank_``. A dump is a dict:
``version`` ("2.10"), ``pg_config`` (process group name -> its ``name``, ``desc`` and ``ranks``,
the last a string "[0, 1]"), ``pg_status`` (name -> the last collective enqueued, started,
completed) and ``entries``, one per collective: ``profiling_name`` ("nccl:all_reduce",
"gloo:send 0->1"), ``process_group`` (name, desc), ``collective_seq_id`` (counted per process
group; ``p2p_seq_id`` for sends and receives), ``input_sizes``/``output_sizes``, the dtypes,
``state`` (scheduled, started, completed), ``retired``, ``time_created_ns`` and ``frames``, the
Python stack that called it ({filename, line, name}, innermost first).

The rule (``autopsy``), per process group: each member's last enqueued collective (its highest
sequence number). Members behind the others never joined the next one: they are the culprits,
the collective is the next one as the ranks ahead recorded it, and the ranks ahead waited in it.
All members at the same number: if they recorded different collectives there (another type or
other sizes), the ranks in the minority desynced; if they agree and it did not complete, no rank
is missing and the collective itself stalled. A member with no dump is named: a rank that died
writes none. PyTorch's own analyzer (``torch.distributed.flight_recorder``) matches the same
entries its own way; its finding is quoted beside the verdict, with whether it agrees.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from .classify import is_library, short_path
from .threshold import IntThreshold, JUDGEMENT

# The recorder's switches, newest name first (PyTorch reads the older one when the newer is unset).
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DUMP_ON_TIMEOUT_VAR = "TORCH_NCCL_DUMP_ON_TIMEOUT"
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"

MISSING_RANK = "missing-rank"  # a rank never joined the collective the others wait in
DESYNC = "desync"  # ranks called different collectives at the same sequence number
STALLED = "stalled"  # every rank joined; the collective did not complete
NO_HANG = "no-hang"  # every recorded collective completed
UNKNOWN = "unknown"

# Stack frames shown per entry: the user's call and a few callers. Judgement: a training loop's
# call site is within the first few frames outside torch.distributed.
MAX_FRAMES = IntThreshold(
    8, "frames", JUDGEMENT,
    "Stack frames shown per flight-recorder entry: a training loop's call site is within the first few frames "
    "outside torch.distributed.")


# --------------------------------------------------------------------------- the environment


def _first(env: Mapping[str, str], keys: Sequence[str]) -> tuple[str, str] | None:
    for k in keys:
        v = env.get(k)
        if v is not None and v.strip():
            return k, v.strip()
    return None


def buffer_size(env: Mapping[str, str]) -> int:
    """The recorder's buffer as the environment sets it (0: off, or not set)."""
    kv = _first(env, BUFFER_VARS)
    try:
        return max(0, int(kv[1])) if kv else 0
    except ValueError:
        return 0


def dump_prefix(env: Mapping[str, str]) -> tuple[str, str]:
    """(the dumps' prefix, where it comes from: a variable's name or "PyTorch's default")."""
    kv = _first(env, PREFIX_VARS)
    return (kv[1], kv[0]) if kv else (DEFAULT_PREFIX, "PyTorch's default")


def autopsy_hint(env: Mapping[str, str]) -> str | None:
    """The next step for a collective hang in a job whose environment turns the recorder on
    (None when it does not): where its dumps land and the command that reads them."""
    n = buffer_size(env)
    if n <= 0:
        return None
    prefix, _ = dump_prefix(env)
    on = next(f"{k}={env[k]}" for k in BUFFER_VARS if k in env)
    if env.get(DUMP_ON_TIMEOUT_VAR, "").strip().lower() in ("1", "true", "yes", "on"):
        return (f"the flight recorder is on ({on}): when the watchdog times out each rank dumps its last "
                f"collectives, and `gputop autopsy {prefix}` names the rank that did not join")
    return (f"the flight recorder is on ({on}) but dumps on a timeout only with {DUMP_ON_TIMEOUT_VAR}=1 "
            f"(NCCL); then `gputop autopsy {prefix}` names the rank that did not join")


# --------------------------------------------------------------------------- a dump's shape


_RANKS_TEXT = re.compile(r"\[\s*(\d+\s*(,\s*\d+\s*)*)?\]")


def dump_problem(obj: Any) -> str | None:
    """Why an unpickled object is not a flight-recorder dump (None: it is one)."""
    if not isinstance(obj, dict):
        return f"it holds a {type(obj).__name__}, not the recorder's dict"
    for key, kind in (("version", str), ("entries", list), ("pg_config", dict)):
        if key not in obj:
            return f"it has no '{key}'"
        if not isinstance(obj[key], kind):
            return f"its '{key}' is a {type(obj[key]).__name__}"
    for name, cfg in obj["pg_config"].items():
        # Strictly a list of rank numbers: PyTorch's analyzer eval()s a ranks string that parses
        # to another string, so nothing else may reach it.
        if not isinstance(name, str) or not isinstance(cfg, dict):
            return "its pg_config is not process group name -> dict"
        ranks = cfg.get("ranks")
        if not (isinstance(ranks, str) and _RANKS_TEXT.fullmatch(ranks)
                or isinstance(ranks, list) and all(type(r) is int for r in ranks)):
            return f"its pg_config's ranks for group {name!r} are not a list of rank numbers"
    if not isinstance(obj.get("pg_status", {}), dict):
        return "its 'pg_status' is not a dict"
    for i, e in enumerate(obj["entries"]):
        if not isinstance(e, dict):
            return f"its entry {i} is a {type(e).__name__}"
        for key in ("profiling_name", "process_group", "collective_seq_id", "record_id"):
            if key not in e:
                return f"its entry {i} has no '{key}'"
        pg = e["process_group"]
        if not isinstance(pg, (tuple, list)) or len(pg) != 2 or not all(isinstance(x, str) for x in pg):
            return f"its entry {i}'s process_group is not (name, desc)"
        if not isinstance(e["profiling_name"], str) or ":" not in e["profiling_name"]:
            return f"its entry {i}'s profiling_name is not 'backend:collective'"
        for key, kinds in _ENTRY_TYPES:
            if key in e and not isinstance(e[key], kinds):
                return f"its entry {i}'s {key} is a {type(e[key]).__name__}"
        for key in ("collective_seq_id", "record_id", "p2p_seq_id"):
            if isinstance(e.get(key), bool):
                return f"its entry {i}'s {key} is a bool"
        if any(not isinstance(f, dict) for f in e.get("frames") or ()):
            return f"its entry {i}'s frames are not {{filename, line, name}}"
    return None


# The entry fields read here, and what the recorder writes in each (a field may be absent).
_ENTRY_TYPES = (
    ("collective_seq_id", int), ("record_id", int), ("p2p_seq_id", int), ("state", str),
    ("retired", (bool, type(None))), ("is_p2p", bool), ("time_created_ns", (int, type(None))),
    ("frames", (list, type(None))), ("input_sizes", (list, type(None))), ("output_sizes", (list, type(None))),
    ("input_dtypes", (list, type(None))), ("output_dtypes", (list, type(None))),
)


def _ranks_of(text: Any) -> list[int] | None:
    """pg_config's ranks: the string "[0, 1]" (a list in some versions)."""
    if isinstance(text, (list, tuple)):
        return [int(r) for r in text]
    if isinstance(text, str):
        try:
            v = json.loads(text)
        except ValueError:
            v = [int(x) for x in re.findall(r"-?\d+", text)]
        if isinstance(v, list):
            return [int(r) for r in v]
    return None


def rebuild_pg_config(dumps: Mapping[int, Mapping[str, Any]]) -> tuple[dict[int, dict[str, Any]], str | None]:
    """The dumps with a ``pg_config`` that names every process group their entries use.

    PyTorch 2.13's gloo backend records a group's ranks when the group is constructed, before it
    has its name and description: its dumps' ``pg_config`` holds one unnamed entry (``''``) while
    the entries name the group ("0", "default_pg"), and PyTorch's analyzer cannot match them
    (KeyError). Such a group's members are rebuilt: for the default group, every rank the unnamed
    entry lists and every rank that left a dump; for another group, the ranks whose entries use
    it. Returns the dumps (copies where changed) and a note saying what was rebuilt (None: nothing)."""
    used: dict[str, tuple[str, set[int]]] = {}
    for rank, d in dumps.items():
        for e in d.get("entries", ()):
            name, desc = str(e["process_group"][0]), str(e["process_group"][1])
            used.setdefault(name, (desc, set()))[1].add(rank)
    unnamed: set[int] = set()
    for d in dumps.values():
        cfg = d.get("pg_config", {}).get("")
        if isinstance(cfg, dict):
            unnamed |= set(_ranks_of(cfg.get("ranks")) or ())
    out: dict[int, dict[str, Any]] = {}
    rebuilt: set[str] = set()
    for rank, d in dumps.items():
        cfg = dict(d.get("pg_config", {}))
        names = {str(e["process_group"][0]) for e in d.get("entries", ())}
        lacking = sorted(n for n in names if n not in cfg)
        if not lacking:
            out[rank] = dict(d)
            continue
        for name in lacking:
            desc, users = used[name]
            members = (set(dumps) | unnamed) if desc == "default_pg" else set(users)
            cfg[name] = {"name": name, "desc": desc, "ranks": str(sorted(members))}
            rebuilt.add(f"{name} ({desc})" if desc and desc != name else name)
        cfg.pop("", None)
        out[rank] = dict(d, pg_config=cfg)
    if not rebuilt:
        return out, None
    return out, ("the dumps' process-group table does not name the groups their entries use (PyTorch's "
                 "gloo records it before a group has its name): members of " + ", ".join(sorted(rebuilt))
                 + " rebuilt from the dumps (the default group: every rank that left one)")


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Frame:
    filename: str
    line: int | None
    name: str

    def text(self) -> str:
        return f"{short_path(self.filename)}:{self.line if self.line is not None else '?'} in {self.name}"


@dataclass(frozen=True)
class Entry:
    """One collective (or send/receive) as one rank recorded it."""

    rank: int
    backend: str  # "nccl", "gloo"
    op: str  # "all_reduce", "send"
    peer: str | None  # a send's or receive's "0->1"
    seq: int  # collective_seq_id (p2p_seq_id for sends and receives)
    p2p: bool
    group: str  # the process group's name ("0")
    desc: str  # its description ("default_pg")
    state: str  # scheduled | started | completed
    retired: bool | None
    input_sizes: Any
    output_sizes: Any
    dtypes: tuple[str, ...]
    record_id: int
    time_ns: int | None
    frames: tuple[Frame, ...]

    @property
    def done(self) -> bool:
        """Completed as far as the recorder knows: NCCL's state, or retired (gloo records no
        state and retires a collective that failed on its timeout too)."""
        return self.state == "completed" or self.retired is True

    def signature(self) -> tuple:
        """What every member must agree on for the collective to match."""
        return (self.op, _freeze(self.input_sizes), _freeze(self.output_sizes), self.dtypes)

    def name(self) -> str:
        return f"{self.op}{' ' + self.peer if self.peer else ''} #{self.seq}"

    def group_text(self) -> str:
        return f"process group {self.group}" + (f" ({self.desc})" if self.desc and self.desc not in (self.group, "undefined") else "")

    def sizes_text(self) -> str:
        ins = _sizes(self.input_sizes)
        outs = _sizes(self.output_sizes)
        dt = "/".join(dict.fromkeys(self.dtypes)) if self.dtypes else ""
        text = f"input {ins}" + (f" {dt}" if dt else "")
        return text + (f", output {outs}" if outs != ins else "")

    def call_site(self) -> Frame | None:
        """Where the user's code made the call: the newest frame outside torch.distributed (and
        outside libraries when the user's own code is in the stack)."""
        outside = [f for f in self.frames if not _torch_dist(f.filename)]
        own = [f for f in outside if not is_library(f.filename)]
        return (own or outside or [None])[0]

    def stack(self) -> tuple[Frame, ...]:
        """The frames outside torch.distributed, innermost first."""
        return tuple(f for f in self.frames if not _torch_dist(f.filename))


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def _sizes(v: Any) -> str:
    """The recorder's sizes, one shape per tensor: [[4, 8]] -> '[4, 8]', [[4], [8]] -> '[4], [8]'."""
    if not isinstance(v, (list, tuple)):
        return str(v)
    if v and all(isinstance(x, (list, tuple)) for x in v):
        return ", ".join("[" + ", ".join(str(n) for n in x) + "]" for x in v)
    return "[" + ", ".join(str(n) for n in v) + "]"


def _torch_dist(filename: str) -> bool:
    return "/torch/distributed/" in filename.replace("\\", "/")


def entry_of(rank: int, e: Mapping[str, Any]) -> Entry:
    backend, _, name = str(e["profiling_name"]).partition(":")
    op, _, peer = name.partition(" ")
    p2p = bool(e.get("is_p2p", op in ("send", "recv")))
    frames = tuple(Frame(str(f.get("filename", "?")), f.get("line") if isinstance(f.get("line"), int) else None,
                         str(f.get("name", "?")))
                   for f in (e.get("frames") or ()) if isinstance(f, dict))
    dtypes = tuple(str(x) for x in (e.get("input_dtypes") or ()))
    return Entry(rank=rank, backend=backend, op=op, peer=peer or None,
                 seq=int(e.get("p2p_seq_id", 0) if p2p else e["collective_seq_id"]), p2p=p2p,
                 group=str(e["process_group"][0]), desc=str(e["process_group"][1]),
                 state=str(e.get("state", "?")), retired=e.get("retired") if isinstance(e.get("retired"), bool) else None,
                 input_sizes=e.get("input_sizes"), output_sizes=e.get("output_sizes"), dtypes=dtypes,
                 record_id=int(e["record_id"]), time_ns=e.get("time_created_ns") if isinstance(e.get("time_created_ns"), int) else None,
                 frames=frames)


# --------------------------------------------------------------------------- PyTorch's analyzer


@dataclass(frozen=True)
class AnalyzerFinding:
    """The first collective PyTorch's analyzer (``build_db``) could not match on every rank."""

    seq: int
    op: str  # "all_reduce" (its profiling name without the backend)
    pg_desc: str  # "0:default_pg"
    missing_ranks: tuple[int, ...]  # ranks that did not join it
    mismatched: tuple[tuple[int, str], ...]  # (rank, the analyzer's words) for a collective that differs
    expected_ranks: tuple[int, ...]
    message: str  # the analyzer's own line for it, from its log ("Not all ranks joining collective, ...")

    def culprits(self) -> tuple[int, ...]:
        return self.missing_ranks or tuple(r for r, _ in self.mismatched)


@dataclass(frozen=True)
class AnalyzerView:
    """What PyTorch's analyzer said: its torch version, its finding (None: every collective
    matched), or why it could not run on these dumps."""

    torch_version: str
    finding: AnalyzerFinding | None = None
    error: str | None = None
    collectives: int = 0
    remark: str = ""  # its last word on a collective it could not judge ("We cannot decide ...")


def analyzer_view(result: Mapping[str, Any]) -> AnalyzerView:
    """From the analyzer's result as the source hands it: ``torch_version``, ``error`` (a string
    or None), ``collectives`` (its Collective records as dicts) and ``log`` (its log lines)."""
    version = str(result.get("torch_version", "?"))
    if result.get("error"):
        return AnalyzerView(version, error=str(result["error"]))
    colls = list(result.get("collectives") or ())
    log = [str(x) for x in result.get("log") or ()]
    for c in colls:
        missing = tuple(sorted(int(r) for r in (c.get("missing_ranks") or ())))
        mism = tuple(sorted((int(r), str(m.get("type_of_mismatch") or "mismatch"))
                            for r, m in (c.get("mismatch_collectives") or {}).items()))
        if not missing and not mism and c.get("pass_check", True):
            continue
        seq = int(c.get("collective_seq_id", -1))
        name = str(c.get("collective_name", "?")).partition(":")[2] or str(c.get("collective_name", "?"))
        return AnalyzerView(version, AnalyzerFinding(
            seq=seq, op=name, pg_desc=str(c.get("pg_desc", "?")), missing_ranks=missing, mismatched=mism,
            expected_ranks=tuple(sorted(int(r) for r in c.get("expected_ranks") or ())),
            message=_log_line(log, seq)), collectives=len(colls))
    remark = next((ln.strip() for ln in reversed(log) if _REMARK.search(ln)), "")
    return AnalyzerView(version, None, collectives=len(colls), remark=remark)


# The analyzer's words for a collective it matched on the ranks it has but could not judge.
_REMARK = re.compile(r"cannot decide|No errors found|Too many mismatches", re.I)


def _log_line(log: Sequence[str], seq: int) -> str:
    """The analyzer's headline for sequence number ``seq`` ("Not all ranks joining collective,
    sequence number: 4"; "Collective sequence number: 4 has errors")."""
    for line in log:
        if re.search(rf"sequence number:? {seq}\b", line):
            return line.strip()
    return ""


# --------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Autopsy:
    kind: str  # MISSING_RANK | DESYNC | STALLED | NO_HANG | UNKNOWN
    summary: str
    ranks: tuple[int, ...]  # the ranks whose dumps were read
    backend: str | None = None
    version: str | None = None  # the recorder's format
    culprits: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    no_dump: tuple[int, ...] = ()  # members of the group that left no dump
    collective: Entry | None = None  # the collective the waiting ranks are in, as one of them recorded it
    culprit_entry: Entry | None = None  # a desynced culprit's own collective at that number
    culprit_last: Entry | None = None  # the culprit's last recorded entry
    members: tuple[int, ...] = ()
    analyzer: AnalyzerView | None = None
    agrees: bool | None = None  # whether the analyzer names the same ranks and number
    notes: tuple[str, ...] = field(default=())


def _span(ranks: Iterable[int]) -> str:
    """'0-3, 5': consecutive ranks as ranges."""
    rs = sorted(set(ranks))
    out: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}" if j > i + 1 else f"{rs[i]}, {rs[j]}")
        i = j + 1
    return ", ".join(out)


def _who(ranks: Iterable[int]) -> str:
    rs = sorted(set(ranks))
    return ("rank " if len(rs) == 1 else "ranks ") + _span(rs)


@dataclass
class _Group:
    name: str
    desc: str
    members: set[int]
    entries: dict[int, list[Entry]]  # rank -> its collectives in this group (record order)
    enqueued: dict[int, int]  # rank -> pg_status's last enqueued, where the dump has it


def _groups(dumps: Mapping[int, Mapping[str, Any]]) -> list[_Group]:
    groups: dict[str, _Group] = {}
    for rank, d in sorted(dumps.items()):
        for name, cfg in (d.get("pg_config") or {}).items():
            if not isinstance(cfg, dict) or name == "":
                continue
            g = groups.setdefault(str(name), _Group(str(name), str(cfg.get("desc", "")), set(), {}, {}))
            g.members |= set(_ranks_of(cfg.get("ranks")) or ())
        for raw in d.get("entries", ()):
            e = entry_of(rank, raw)
            if e.p2p:
                continue
            g = groups.setdefault(e.group, _Group(e.group, e.desc, set(), {}, {}))
            g.desc = g.desc or e.desc
            g.members.add(rank)
            g.entries.setdefault(rank, []).append(e)
        for name, st in (d.get("pg_status") or {}).items():
            if isinstance(st, dict) and isinstance(st.get("last_enqueued_collective"), int) and str(name) in groups:
                groups[str(name)].enqueued[rank] = st["last_enqueued_collective"]
    return [g for g in groups.values() if g.entries]


def _last_seq(g: _Group, rank: int) -> int:
    """The rank's last enqueued collective in the group: its highest recorded number, or its
    status's when that is higher (or its buffer holds none of the group's)."""
    return max([e.seq for e in g.entries.get(rank, ())] + [g.enqueued.get(rank, 0)])


def _at(g: _Group, rank: int, seq: int) -> Entry | None:
    return next((e for e in reversed(g.entries.get(rank, ())) if e.seq == seq), None)


def _last_entry(dumps: Mapping[int, Mapping[str, Any]], rank: int) -> Entry | None:
    raw = (dumps.get(rank) or {}).get("entries") or []
    return entry_of(rank, max(raw, key=lambda e: e["record_id"])) if raw else None


def _judge_group(g: _Group, dumps: Mapping[int, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The group's problem (None: every member's collectives completed)."""
    dumped = sorted(r for r in g.members if r in dumps)
    no_dump = tuple(sorted(r for r in g.members if r not in dumps))
    last = {r: _last_seq(g, r) for r in dumped}
    lo, hi = min(last.values()), max(last.values())
    base = dict(group=g, no_dump=no_dump, members=tuple(sorted(g.members)))
    if lo < hi:
        behind = tuple(r for r in dumped if last[r] == lo)
        ahead = tuple(r for r in dumped if last[r] > lo)
        coll = next((e for r in ahead if (e := _at(g, r, lo + 1)) is not None), None)
        return dict(base, kind=MISSING_RANK, culprits=behind, waiting=ahead, seq=lo + 1, collective=coll,
                    time=coll.time_ns if coll and coll.time_ns else 0)
    at = {r: _at(g, r, hi) for r in dumped}
    sigs: dict[tuple, list[int]] = {}
    for r, e in at.items():
        if e is not None:
            sigs.setdefault(e.signature(), []).append(r)
    pending = [e for e in at.values() if e is not None and not e.done]
    if len(sigs) > 1:
        ordered = sorted(sigs.values(), key=lambda rs: (-len(rs), rs))
        majority, minority = ordered[0], [r for rs in ordered[1:] for r in rs]
        coll = at[majority[0]]
        return dict(base, kind=DESYNC, culprits=tuple(sorted(minority)), waiting=tuple(sorted(majority)), seq=hi,
                    collective=coll, culprit_entry=at[min(minority)], time=coll.time_ns if coll and coll.time_ns else 0,
                    tie=len(ordered[0]) == len(ordered[1]))
    if no_dump:
        coll = next((e for e in at.values() if e is not None), None)
        return dict(base, kind=MISSING_RANK, culprits=no_dump, waiting=tuple(dumped), seq=hi + (0 if pending else 1),
                    collective=coll if pending else None, time=coll.time_ns if coll and coll.time_ns else 0)
    if pending:
        coll = pending[0]
        return dict(base, kind=STALLED, culprits=(), waiting=tuple(dumped), seq=hi, collective=coll,
                    time=coll.time_ns or 0)
    return None


_ORDER = {MISSING_RANK: 0, DESYNC: 1, STALLED: 2}


def autopsy(dumps: Mapping[int, Mapping[str, Any]], analyzer: AnalyzerView | None = None,
            notes: Sequence[str] = ()) -> Autopsy:
    """The verdict from every rank's dump (rank -> the dump as unpickled, its ``pg_config``
    naming the groups its entries use: see ``rebuild_pg_config``) and PyTorch's analyzer's view."""
    ranks = tuple(sorted(dumps))
    first = next(iter(dumps.values()), {})
    backends = sorted({str(e["profiling_name"]).partition(":")[0] for d in dumps.values() for e in d.get("entries", ())})
    backend = "/".join(backends) or None
    version = str(first.get("version")) if first else None
    common = dict(ranks=ranks, backend=backend, version=version, analyzer=analyzer, notes=tuple(notes))
    if not any(d.get("entries") for d in dumps.values()):
        return Autopsy(UNKNOWN, "the dumps hold no collectives (the recorder's buffer was empty: "
                                "was TORCH_FR_BUFFER_SIZE set in the job?)", **common)
    problems = [p for g in _groups(dumps) if (p := _judge_group(g, dumps)) is not None]
    if not problems:
        a = Autopsy(NO_HANG, "every recorded collective completed on every rank: the hang is outside the "
                             "collectives these buffers hold", **common)
        return _with_analyzer(a)
    p = min(problems, key=lambda x: (_ORDER[x["kind"]], x["time"] or 0))
    g: _Group = p["group"]
    coll: Entry | None = p["collective"]
    seq = p["seq"]
    what = coll.name() if coll is not None else f"collective #{seq}"
    where = (coll.group_text() if coll is not None
             else f"process group {g.name}" + (f" ({g.desc})" if g.desc and g.desc != g.name else ""))
    culprits, waiting = p["culprits"], p["waiting"]
    verb = "waits" if len(waiting) == 1 else "wait"
    if p["kind"] == MISSING_RANK and culprits and set(culprits) <= set(p["no_dump"]):
        summary = (f"{_who(waiting)} {verb} in {what} on {where}; {_who(culprits)} left no dump: "
                   "the likely culprit (a rank that crashed or was killed writes none)")
    elif p["kind"] == MISSING_RANK:
        summary = f"{_who(culprits)} never joined {what} on {where}: {_who(waiting)} {verb} in it"
    elif p["kind"] == DESYNC:
        ce: Entry = p["culprit_entry"]
        summary = (f"desync at #{seq} on {where}: {_who(waiting)} called {coll.op if coll else '?'} "
                   f"({coll.sizes_text() if coll else '?'}), {_who(culprits)} {ce.op} ({ce.sizes_text()})")
        if p.get("tie"):
            summary += "; as many ranks on each side: which side is wrong is not told by the dumps"
    else:
        summary = (f"every rank joined {what} on {where} and it did not complete: no rank is missing (the "
                   "network, a GPU, or the backend itself stalled)")
    summary = summary[0].upper() + summary[1:]
    others = [x for x in problems if x is not p]
    extra = tuple(f"also: {_who(x['culprits']) if x['culprits'] else 'the ranks'} at #{x['seq']} on process group "
                  f"{x['group'].name} ({x['kind']})" for x in others)
    a = Autopsy(
        p["kind"], summary, culprits=tuple(culprits), waiting=tuple(waiting), no_dump=tuple(p["no_dump"]),
        collective=coll, culprit_entry=p.get("culprit_entry"),
        culprit_last=next((e for r in culprits if (e := _last_entry(dumps, r)) is not None), None),
        members=p["members"], **dict(common, notes=tuple(notes) + extra))
    return _with_analyzer(a, seq)


def _with_analyzer(a: Autopsy, seq: int | None = None) -> Autopsy:
    v = a.analyzer
    if v is None or v.error:
        return a
    f = v.finding
    if f is None and v.remark:
        agrees = None  # it could not judge (ranks without dumps): it neither agrees nor differs
    elif f is None:
        agrees = a.kind in (NO_HANG, STALLED)
    else:
        agrees = set(f.culprits()) == set(a.culprits) and f.seq == seq
    return replace(a, agrees=agrees)


# --------------------------------------------------------------------------- text and JSON


def _frames_lines(e: Entry, indent: str) -> list[str]:
    """The stack from the call outwards, to the user's outermost frame (the launcher's and the
    interpreter's frames beyond it counted, not listed)."""
    st = e.stack()
    own = [i for i, f in enumerate(st) if not is_library(f.filename)]
    keep = st[:min(own[-1] + 1, MAX_FRAMES)] if own else st[:MAX_FRAMES]
    lines = [indent + f.text() for f in keep]
    if len(st) > len(keep):
        rest = len(st) - len(keep)
        lines.append(indent + f"… {rest} outer frame{'s' if rest != 1 else ''}"
                     + (" (libraries, the launcher)" if own and len(keep) == own[-1] + 1 else ""))
    return lines


def _entry_line(e: Entry) -> str:
    # The recorder's words, not a claim: gloo records no start or end (every entry reads
    # "scheduled") and retires a collective that failed on its timeout as one that completed.
    state = f"recorded {e.state}" + (", retired" if e.retired else "")
    return f"{e.backend} {e.name()} on {e.group_text()}, {e.sizes_text()} ({state})"


def autopsy_text(a: Autopsy, source: str) -> str:
    """The verdict for the terminal. ``source``: where the dumps were read ("2 dumps at
    /tmp/nccl_trace_rank_<rank>")."""
    head = f"gputop autopsy: {source}"
    meta = [x for x in (f"{_who(a.ranks)}" if a.ranks else "", a.backend or "",
                        f"recorder format {a.version}" if a.version else "") if x]
    lines = [head + (f" ({', '.join(meta)})" if meta else ""), "", a.summary]
    if a.collective is not None:
        c = a.collective
        lines.append(f"  the collective: {_entry_line(c)}")
        site = c.call_site()
        if site is not None:
            lines.append(f"  {_who(a.waiting)} called it at {site.text()}:")
            lines += _frames_lines(c, "      ")
    if a.culprit_entry is not None:
        ce = a.culprit_entry
        lines.append(f"  rank {ce.rank} called instead: {_entry_line(ce)}")
        lines += _frames_lines(ce, "      ")
    if a.culprit_last is not None and a.kind == MISSING_RANK:
        e = a.culprit_last
        lines.append(f"  rank {e.rank}'s last recorded collective: {_entry_line(e)}")
        if e.frames:
            lines += _frames_lines(e, "      ")
        else:
            lines.append("      (no stack: the dump was taken without stack traces)")
        lines.append(f"  what rank {e.rank} did after it is not in the dumps (they hold collectives only): "
                     "its own stack (py-spy dump, gputop stacks --pid PID) shows where it is")
    if a.no_dump and not (a.kind == MISSING_RANK and set(a.culprits) <= set(a.no_dump)):
        lines.append(f"  {_who(a.no_dump)} of the group left no dump")
    lines.append("")
    lines.append(_analyzer_text(a))
    for n in a.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"


def _analyzer_text(a: Autopsy) -> str:
    v = a.analyzer
    if v is None:
        return "PyTorch's analyzer: not run"
    name = f"PyTorch's analyzer (torch {v.torch_version}, torch.distributed.flight_recorder)"
    if v.error:
        return f"{name} could not read these dumps: {v.error}; the verdict above is gputop's reading alone"
    f = v.finding
    if f is None:
        said = v.remark or f"matched all {v.collectives} collectives on every rank"
    else:
        bits = [f"{f.message or f'sequence number {f.seq}'}, {f.op} on {f.pg_desc}"]
        if f.missing_ranks:
            bits.append(f"missing {_who(f.missing_ranks)}")
        bits += [f"rank {r}: {m}" for r, m in f.mismatched]
        said = "; ".join(bits)
    verdict = "agrees" if a.agrees else "differs" if a.agrees is False else "says"
    return f"{name} {verdict}: {said}"


def _frame_dict(f: Frame) -> dict[str, Any]:
    return {"file": f.filename, "line": f.line, "function": f.name}


def entry_dict(e: Entry | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "rank": e.rank, "backend": e.backend, "type": e.op, "peer": e.peer, "seq": e.seq, "p2p": e.p2p,
        "process_group": e.group, "pg_desc": e.desc, "input_sizes": e.input_sizes, "output_sizes": e.output_sizes,
        "dtypes": list(e.dtypes), "state": e.state, "retired": e.retired, "time_created_ns": e.time_ns,
        "stack": [_frame_dict(f) for f in e.stack()],
    }


def autopsy_dict(a: Autopsy, source: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict as JSON-ready data; ``source``: where the dumps came from (prefix, files)."""
    v = a.analyzer
    f = v.finding if v else None
    return {
        "source": dict(source),
        "ranks": list(a.ranks),
        "backend": a.backend,
        "recorder_version": a.version,
        "kind": a.kind,
        "summary": a.summary,
        "culprit_ranks": list(a.culprits),
        "waiting_ranks": list(a.waiting),
        "ranks_without_dump": list(a.no_dump),
        "group_ranks": list(a.members),
        "collective": entry_dict(a.collective),
        "culprit_collective": entry_dict(a.culprit_entry),
        "culprit_last_entry": entry_dict(a.culprit_last),
        "analyzer": None if v is None else {
            "torch_version": v.torch_version,
            "error": v.error,
            "collectives": v.collectives,
            "remark": v.remark,
            "agrees": a.agrees,
            "finding": None if f is None else {
                "seq": f.seq, "type": f.op, "pg_desc": f.pg_desc, "missing_ranks": list(f.missing_ranks),
                "mismatched": [{"rank": r, "error": m} for r, m in f.mismatched],
                "expected_ranks": list(f.expected_ranks), "message": f.message,
            },
        },
        "notes": list(a.notes),
    }
