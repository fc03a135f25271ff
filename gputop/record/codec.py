"""Samples to rows and back.

Writing trusts the samples (they come from our own sources, after redaction); reading trusts
nothing: every value from a file is type-checked, and text loses control characters so a
crafted recording cannot drive the terminal. A row that does not decode is skipped by the
caller and counted as damage.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..model import (
    CoreTimes,
    Event,
    Finding,
    Frame,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcSample,
    Severity,
    StackSample,
    SystemInfo,
    TaskSample,
    ThreadState,
    UtilPoint,
)
from ..redact import redact_cmdline, redact_code, redact_text, redact_value
from .schema import (
    CATEGORY_CODES,
    CATEGORY_SHIFT,
    CATEGORY_TO_CODE,
    FLAG_ACTIVE,
    FLAG_GIL,
    GPU_FIELDS,
    GPU_PROC_FIELDS,
    HOST_FIELDS,
    PROC_FIELDS,
    SEVERITIES,
    TASK_FIELDS,
    Field,
    pack_cores,
    unpack_cores,
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Text fields longer than this are cut: a recording is not a place for megabyte strings, and a
# crafted file should not make the UI lay out one.
MAX_TEXT = 4096


# --------------------------------------------------------------------------- validation


def clean_text(v: Any, limit: int = MAX_TEXT) -> str:
    if not isinstance(v, str):
        return "" if v is None else clean_text(str(v) if isinstance(v, (int, float)) else "", limit)
    if len(v) > limit:
        v = v[:limit] + "…"
    return _CONTROL.sub("?", v)


def opt_text(v: Any) -> str | None:
    return None if v is None else clean_text(v)


def fnum(v: Any) -> float | None:
    t = type(v)
    if t is float:
        return v
    if t is int:
        return float(v)
    return None


def inum(v: Any) -> int | None:
    t = type(v)
    if t is int:
        return v
    if t is float and v.is_integer():
        return int(v)
    return None


def req_float(v: Any) -> float:
    f = fnum(v)
    if f is None or f != f:
        raise ValueError("missing timestamp")
    return f


# --------------------------------------------------------------------------- redaction


def redact_proc(s: ProcSample) -> ProcSample:
    """Second pass over what the host source already redacted: a recording outlives the screen."""
    cmd = redact_cmdline(s.cmdline.split(" ")) if s.cmdline else s.cmdline
    env = tuple((k, redact_value(k, v)) for k, v in s.env)
    if cmd == s.cmdline and env == s.env:
        return s
    return dataclasses.replace(s, cmdline=cmd, env=env)


# --------------------------------------------------------------------------- fields


def scaled(v: float | None, scale: int) -> int | None:
    if v is None or v != v or v in (_INF, -_INF):
        return None
    return round(v * scale)


_INF = float("inf")


def enc(f: Field, v: Any, string_id: Callable[[str], int]) -> int | None:
    if v is None:
        return None
    if f.kind == "f":
        return scaled(v, f.scale)
    if f.kind == "i":
        return int(v)
    return string_id(str(v))


def dec(f: Field, v: int | None, strings: Mapping[int, str]) -> Any:
    if v is None:
        return None
    if f.kind == "f":
        return v / f.scale if f.scale != 1 else float(v)
    if f.kind == "i":
        return v
    return clean_text(strings.get(v, "?"))


def _fields(fields: tuple[Field, ...], values: Iterable[int | None], strings: Mapping[int, str]) -> dict[str, Any]:
    return {f.name: dec(f, v, strings) for f, v in zip(fields, values) if v is not None}


def _positional(fields: tuple[Field, ...], values: Sequence[int | None], strings: Mapping[int, str]) -> list[Any]:
    """Decoded values in field order (the hot path of a seek: no per-field dict)."""
    out: list[Any] = []
    for (kind, scale), v in zip(_SPECS[fields], values):
        if v is None:
            out.append(None)
        elif kind == "f":
            out.append(v / scale)
        elif kind == "i":
            out.append(v)
        else:
            out.append(clean_text(strings.get(v, "?")))
    return out


# (kind, scale) per field of each layout, looked up once per row rather than per attribute.
_SPECS = {fields: tuple((f.kind, f.scale) for f in fields) for fields in (GPU_FIELDS, HOST_FIELDS, PROC_FIELDS,
                                                                          GPU_PROC_FIELDS)}


# --------------------------------------------------------------------------- series rows


def gpu_row(s: GpuSample, string_id) -> tuple:
    return (s.ts, s.index) + tuple(enc(f, getattr(s, f.name), string_id) for f in GPU_FIELDS)


def gpu_from_row(r: tuple, strings: Mapping[int, str]) -> GpuSample:
    # GPU_FIELDS follow GpuSample's field order after (ts, index) (a test checks it).
    if r[1] is None:
        raise ValueError("bad gpu index")
    return GpuSample(r[0], r[1], *_positional(GPU_FIELDS, r[2:], strings))


def util_row(p: UtilPoint) -> tuple:
    return (p.ts, p.index, scaled(p.util, 100))


def util_from_row(r: tuple) -> UtilPoint:
    if r[1] is None or r[2] is None:
        raise ValueError("bad utilisation point")
    return UtilPoint(r[0], r[1], r[2] / 100)


def gpu_proc_row(p: GpuProcess, string_id) -> tuple:
    return (p.ts,) + tuple(enc(f, getattr(p, f.name), string_id) for f in GPU_PROC_FIELDS)


def gpu_proc_from_row(r: tuple, strings: Mapping[int, str]) -> GpuProcess:
    kw = _fields(GPU_PROC_FIELDS, r[1:], strings)
    if "gpu_index" not in kw or "pid" not in kw:
        raise ValueError("bad process entry")
    kw["kind"] = clean_text(kw.get("kind") or "C", 8)
    return GpuProcess(ts=r[0], **kw)


_HOST_DEFAULTS = {"cpu_percent": 0.0, "iowait_percent": 0.0, "steal_percent": 0.0, "mem_total": 0, "mem_used": 0,
                  "mem_available": 0, "swap_total": 0, "swap_used": 0}


def host_row(h: HostSample, string_id) -> tuple:
    return (h.ts,) + tuple(enc(f, getattr(h, f.name), string_id) for f in HOST_FIELDS) + (pack_cores(h.cores),)


def host_from_row(r: tuple, strings: Mapping[int, str]) -> HostSample:
    # A file before version 3 has no cgroup columns: the fields it has, the rest None.
    kw = dict(zip(_HOST_NAMES, _positional(HOST_FIELDS, r[1:-1], strings)))
    for k, v in _HOST_DEFAULTS.items():
        if kw.get(k) is None:
            kw[k] = v
    cores = tuple(CoreTimes(*c) for c in unpack_cores(r[-1]))
    return HostSample(ts=r[0], cores=cores, **kw)


_HOST_NAMES = tuple(f.name for f in HOST_FIELDS)


def proc_row(proc_ref: int, s: ProcSample, string_id) -> tuple:
    return (s.ts, proc_ref) + tuple(enc(f, getattr(s, f.name), string_id) for f in PROC_FIELDS)


def proc_from_row(r: tuple, identities: Mapping[int, dict[str, Any]], strings: Mapping[int, str]) -> ProcSample:
    ident = identities.get(r[1])  # type: ignore[arg-type]
    if ident is None:
        raise ValueError("unknown process")
    return ProcSample(ts=r[0], **ident, **dict(zip(_PROC_NAMES, _positional(PROC_FIELDS, r[2:], strings))))


_PROC_NAMES = tuple(f.name for f in PROC_FIELDS)


def task_row(s: TaskSample, string_id) -> tuple:
    """The process's counters and its main thread's reading (schema.TASK_FIELDS); a path the
    thread waits on is redacted as any text is (a token can sit in a file name), and so is its
    file system, named by its mount point ("tmpfs on /mnt/token=..."): a path as much as fd_path,
    it kept the secret in the file while fd_path was redacted."""
    main = next((t for t in s.threads if t.tid == s.pid), None)
    vals: dict[str, Any] = {"pid": s.pid, "ppid": s.ppid, "rchar": s.rchar, "wchar": s.wchar}
    if main is not None:
        vals.update(name=main.name, state=main.state, cpu_ns=main.cpu_ns, runs=main.runs, wakes=main.wakes,
                    wchan=main.wchan, syscall=main.syscall,
                    fd_path=redact_text(main.fd_path) if main.fd_path else None,
                    fs=redact_text(main.fs) if main.fs else None)
    return (s.ts,) + tuple(enc(f, vals.get(f.name), string_id) for f in TASK_FIELDS)


# The read side redacts the two paths again, as it does command lines: a file written before
# ``fs`` was redacted holds the raw mount point, which a report or replay judging again would show.
# Cached: the same few paths come back in every reading.
_redact_path = lru_cache(maxsize=1024)(redact_text)


def task_from_row(r: tuple, strings: Mapping[int, str]) -> TaskSample:
    kw = _fields(TASK_FIELDS, r[1:], strings)
    for k in ("fd_path", "fs"):
        if isinstance(kw.get(k), str):
            kw[k] = _redact_path(kw[k])
    pid = kw.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        raise ValueError("bad task sample")
    threads: tuple[ThreadState, ...] = ()
    if "state" in kw:
        threads = (ThreadState(tid=pid, name=clean_text(kw.get("name") or "", 64), state=clean_text(kw["state"], 4),
                               cpu_ns=kw.get("cpu_ns"), runs=kw.get("runs"), wakes=kw.get("wakes"),
                               wchan=kw.get("wchan"), syscall=kw.get("syscall"), fd_path=kw.get("fd_path"),
                               fs=kw.get("fs")),)
    return TaskSample(ts=r[0], pid=pid, ppid=kw.get("ppid"), threads=threads, rchar=kw.get("rchar"),
                      wchar=kw.get("wchar"))


# --------------------------------------------------------------------------- processes

# What identifies one process over its life; stored once in `processes`.
ProcIdentity = tuple  # (pid, ppid, name, user, cmdline, create_time, role, env_json)


def proc_identity(s: ProcSample) -> ProcIdentity:
    env = json.dumps(list(s.env), separators=(",", ":")) if s.env else None
    return (s.pid, s.ppid, s.name, s.user, s.cmdline, s.create_time, s.role, env)


def proc_identity_from_row(row: tuple) -> dict[str, Any]:
    """``processes`` row (id, pid, ppid, name, user, cmdline, create_time, role, env)."""
    pid = inum(row[1])
    if pid is None:
        raise ValueError("bad pid")
    env: tuple[tuple[str, str], ...] = ()
    if isinstance(row[8], str):
        try:
            items = json.loads(row[8])
            env = tuple(
                (clean_text(kv[0], 256), redact_value(kv[0], clean_text(kv[1])))
                for kv in items
                if isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str) and isinstance(kv[1], str)
            )
        except (ValueError, TypeError):
            env = ()
    return {
        "pid": pid,
        "ppid": inum(row[2]),
        "name": clean_text(row[3], 256),
        "user": opt_text(row[4]),
        # Redacted again as it is read: a recording made before redaction learnt a secret's form
        # (a JSON argument, a Hydra override) still shows it as ***.
        "cmdline": redact_cmdline(clean_text(row[5]).split(" ")) if row[5] else clean_text(row[5]),
        "create_time": fnum(row[6]),
        "role": clean_text(row[7], 32) or "gpu",
        "env": env,
    }


# --------------------------------------------------------------------------- stacks


def stack_flags(s: StackSample) -> int:
    code = CATEGORY_TO_CODE.get(s.category, 0)
    return (FLAG_ACTIVE if s.active else 0) | (FLAG_GIL if s.owns_gil else 0) | (code << CATEGORY_SHIFT)


def category_of(flags: int):
    code = flags >> CATEGORY_SHIFT
    return CATEGORY_CODES[code] if code < len(CATEGORY_CODES) else CATEGORY_CODES[0]


def frame_from_row(row: tuple) -> Frame:
    # A NUL in a name or a path is a short read's zero fill past a cut (no Python name or path
    # holds one): the row is damage, not a frame ("site-pack????…" was shown as a real path).
    if any(isinstance(v, str) and "\x00" in v for v in row[1:3]):
        raise ValueError("frame text cut off")
    return Frame(
        name=clean_text(row[1], 512),
        filename=clean_text(row[2], 1024),
        line=inum(row[3]) or 0,
        module=opt_text(row[4]),
        # Redacted again as it is read: a recording made before source lines were redacted
        # shows *** too (as for command lines, see proc_identity_from_row).
        code=(redact_code(clean_text(row[5])) if row[5] else opt_text(row[5])) if len(row) > 5 else None,
        **loop_fields(row[6] if len(row) > 6 else None),
    )


# A frame's loop keepers as stored: at most this many, each statement capped (a foreign file's
# column read as it is would be unbounded).
_KEEPS_MAX, _KEEP_CODE_MAX = 12, 200


def keeps_text(f: Frame) -> str | None:
    """A frame's loop (Frame.loop, Frame.keeps) for the frames table (None: no loop read), each
    statement redacted once more."""
    if not f.keeps and not f.loop and not f.cudnn_off:
        return None
    doc: dict = {"loop": int(f.loop), "keeps": [[int(ln), redact_code(code)] for ln, code in f.keeps[:_KEEPS_MAX]]}
    if f.freed:
        doc["freed"] = [int(ln) for ln in f.freed[:_KEEPS_MAX]]
    if f.accum:
        gate, k, cond, syncing, quiet = f.accum
        doc["accum"] = [int(gate), int(k), redact_code(str(cond)), [int(x) for x in syncing[:_KEEPS_MAX]],
                        [int(x) for x in quiet[:_KEEPS_MAX]]]
    if f.shard:
        doc["shard"] = [int(f.shard[0]), redact_code(str(f.shard[1]))]
    if f.cudnn_off:
        doc["cudnn_off"] = int(f.cudnn_off)
    return json.dumps(doc, separators=(",", ":"))


def loop_fields(text: object) -> dict:
    """The column read back, parsed once: Frame's ``loop``, ``keeps`` and ``freed``; a file from
    before any of them, or anything malformed, reads as none."""
    none = {"loop": 0, "keeps": (), "freed": (), "accum": (), "shard": (), "cudnn_off": 0}
    if not isinstance(text, str) or not text:
        return none
    try:
        doc = json.loads(text)
    except ValueError:
        return none
    if not isinstance(doc, dict):
        return none
    loop = doc.get("loop")
    items, freed = doc.get("keeps"), doc.get("freed")
    keeps = []
    for it in (items if isinstance(items, list) else [])[:_KEEPS_MAX]:
        if isinstance(it, list) and len(it) == 2 and isinstance(it[0], int) and isinstance(it[1], str):
            keeps.append((it[0], redact_code(clean_text(it[1], _KEEP_CODE_MAX))))
    accum, shard = doc.get("accum"), doc.get("shard")

    def lines(v: object) -> tuple[int, ...] | None:
        if not isinstance(v, list):
            return None
        out = tuple(x for x in v[:_KEEPS_MAX] if isinstance(x, int) and 0 < x < 2**31)
        return out if len(out) == len(v[:_KEEPS_MAX]) else None

    ok = (isinstance(accum, list) and len(accum) == 5 and all(isinstance(v, int) and 0 <= v < 2**31 for v in accum[:2])
          and isinstance(accum[2], str) and lines(accum[3]) and lines(accum[4]) is not None)
    off = doc.get("cudnn_off")
    return {"loop": loop if isinstance(loop, int) and 0 <= loop < 2**31 else 0, "keeps": tuple(keeps),
            "cudnn_off": off if isinstance(off, int) and 0 < off < 2**31 else 0,
            "freed": tuple(it for it in (freed if isinstance(freed, list) else [])[:_KEEPS_MAX]
                           if isinstance(it, int) and 0 < it < 2**31),
            "accum": (accum[0], accum[1], redact_code(clean_text(accum[2], _KEEP_CODE_MAX)), lines(accum[3]),
                      lines(accum[4])) if ok else (),
            "shard": (shard[0], redact_code(clean_text(shard[1], _KEEP_CODE_MAX)))
            if isinstance(shard, list) and len(shard) == 2 and isinstance(shard[0], int) and 0 < shard[0] < 2**31
            and isinstance(shard[1], str) else ()}


# --------------------------------------------------------------------------- events, findings


def event_row(e: Event) -> tuple:
    return (e.ts, e.source, e.level, redact_text(e.message))


def event_from_row(row: tuple) -> Event:
    level = clean_text(row[2], 16)
    return Event(
        ts=req_float(row[0]),
        source=clean_text(row[1], 64),
        message=clean_text(row[3]),
        level=level if level in ("info", "warning", "error", "debug") else "info",
    )


def finding_signature(f: Finding) -> tuple:
    """What makes a finding a new row rather than 'still seen': its words, not its numbers."""
    return (f.title, f.severity, f.evidence, f.action, f.expected_gain)


def finding_row(f: Finding) -> tuple:
    evidence = json.dumps([redact_text(e) for e in f.evidence], ensure_ascii=False)
    sev = f.severity.value if isinstance(f.severity, Severity) else str(f.severity)
    return (
        f.ts,
        f.ts,
        f.id,
        f.gpu_index,
        sev,
        f.confidence,
        redact_text(f.title),
        evidence,
        redact_text(f.action),
        redact_text(f.expected_gain),
        f.cost_s,
        f.first_seen,
        gain_bound(f.gain_predicted),
    )


def gain_bound(v: Any) -> float | None:
    """A finding's gain_predicted as stored and read back: a finite positive factor, else None
    (no claim, or a value no rule could have meant)."""
    g = fnum(v)
    return g if g is not None and math.isfinite(g) and g > 0 else None


# A source line quoted in a finding's evidence (`loss.item()` (train.py:42)): the rules quote
# frames' code between backticks.
_QUOTED_CODE = re.compile(r"`([^`\n]+)`")


def _redact_quoted_code(text: str) -> str:
    """Evidence as it is read: the source lines it quotes redacted again, for a recording made
    before source lines were (its evidence had only the free-text pass)."""
    if "`" not in text:
        return text
    return _QUOTED_CODE.sub(lambda m: f"`{redact_code(m.group(1))}`", text)


def finding_from_row(row: tuple) -> Finding:
    """``findings`` row (ts, last_seen, finding_id, gpu, severity, confidence, title, evidence,
    action, expected_gain, cost_s, first_seen[, gain_predicted]); a row without the last (a file
    from before the column, see schema.FINDINGS_OPTIONAL) reads gain_predicted None."""
    evidence: tuple[str, ...] = ()
    if isinstance(row[7], str):
        try:
            items = json.loads(row[7])
            if isinstance(items, list):
                evidence = tuple(_redact_quoted_code(clean_text(x)) for x in items if isinstance(x, str))
        except ValueError:
            evidence = ()
    conf = fnum(row[5])
    return Finding(
        id=clean_text(row[2], 128),
        title=clean_text(row[6], 512),
        severity=SEVERITIES.get(row[4], Severity.INFO) if isinstance(row[4], str) else Severity.INFO,
        confidence=min(1.0, max(0.0, conf)) if conf is not None else 0.0,
        evidence=evidence,
        action=clean_text(row[8]),
        expected_gain=clean_text(row[9], 512),
        cost_s=fnum(row[10]) or 0.0,
        gpu_index=inum(row[3]),
        ts=req_float(row[0]),
        first_seen=fnum(row[11]) or 0.0,
        gain_predicted=gain_bound(row[12]) if len(row) > 12 else None,
    )


# --------------------------------------------------------------------------- static info (JSON)


def info_json(obj: SystemInfo | GpuInfo) -> str:
    d = dataclasses.asdict(obj)
    d.pop("ts", None)
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _typed_fields(cls) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def _from_json(cls, ts: float, data: Any, extra: dict[str, Any], defaults: dict[str, Any] | None = None) -> Any:
    try:
        d = json.loads(data) if isinstance(data, str) else None
    except ValueError:
        d = None
    if not isinstance(d, dict):
        raise ValueError("bad JSON")
    kw: dict[str, Any] = dict(extra)
    for name, typ in _typed_fields(cls).items():
        if name in ("ts",) or name in kw or name not in d:
            continue
        v = d[name]
        if v is None:
            kw[name] = None
        elif typ.startswith("tuple"):
            if isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v):
                kw[name] = (v[0], v[1])
        elif typ.startswith("bool"):
            if isinstance(v, bool):
                kw[name] = v
        elif typ.startswith("int"):
            if inum(v) is not None and not isinstance(v, bool):
                kw[name] = inum(v)
        elif typ.startswith("float"):
            if fnum(v) is not None and not isinstance(v, bool):
                kw[name] = fnum(v)
        elif typ.startswith("str"):
            kw[name] = clean_text(v, 512)
    for k, v in (defaults or {}).items():
        if not kw.get(k):
            kw[k] = v
    return cls(ts=ts, **kw)


def system_info_from_row(row: tuple) -> SystemInfo:
    return _from_json(SystemInfo, req_float(row[0]), row[1], {})


def gpu_info_from_row(row: tuple) -> GpuInfo:
    """``gpu_info`` row (ts, gpu, data)."""
    gpu = inum(row[1])
    if gpu is None:
        raise ValueError("bad gpu")
    return _from_json(GpuInfo, req_float(row[0]), row[2], {"index": gpu}, {"name": "GPU"})


def iter_valid(rows: Iterable[tuple], decode) -> tuple[list, int]:
    """Decode rows, skipping (and counting) the ones that do not decode."""
    out = []
    bad = 0
    for r in rows:
        try:
            out.append(decode(r))
        except (ValueError, TypeError, KeyError, IndexError):
            bad += 1
    return out, bad
