"""PyTorch flight-recorder dumps: found, read without trusting them, and put through PyTorch's own
analyzer. Decides nothing: the verdict is ``gputop.analysis.flight_recorder``'s.

**Which files.** Only the recorder's naming: ``PREFIX<rank>``, a prefix and a rank number, as
PyTorch writes them (``TORCH_FR_DUMP_TEMP_FILE``, else ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else
``/tmp/nccl_trace_rank_``). The user names a directory (its files ``<prefix><rank>``, one prefix),
a prefix, or one dump (its siblings are read with it); nothing else in a directory is opened.

**Why unpickling them is safe.** A dump is a pickle, and a pickle can run code when loaded. These
are not trusted: they are loaded with an unpickler that resolves no class or function at all
(``find_class`` refuses every name), which leaves only what the recorder writes (dicts, lists,
tuples, strings, numbers, booleans, None). A file planted at the default ``/tmp`` path, or any
other pickle, is refused in one line before any of its code could run; PyTorch's own loader
(``components.loader.read_dump``) uses plain ``pickle.load`` and is not used for that reason.
The dicts are then handed to PyTorch's analyzer (``components.builder.build_db``) in-process,
once ``analysis.flight_recorder.dump_problem`` has checked their shape: the analyzer ``eval()``s a
process group's ranks when they parse to a string, so only a plain list of rank numbers reaches it.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import re
import stat
import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Mapping

from ..errors import os_reason

# Larger than any dump the recorder writes (20,000 entries with stacks are tens of MB); a file
# above it is refused before it is read. Judgement.
MAX_DUMP_BYTES = 1 << 30

_RANK_SUFFIX = re.compile(r"^(.*?[^\d])(\d+)$")


class DumpError(Exception):
    """A dump cannot be found or read: ``str(exc)`` is the one line to show."""


class AnalyzerUnavailable(Exception):
    """PyTorch (or its flight-recorder analyzer) cannot be imported: ``str(exc)`` says why."""


@dataclass(frozen=True)
class DumpSet:
    prefix: str  # the path before the rank number
    files: dict[int, Path]  # rank -> its dump


def _dumps_with(prefix: Path) -> dict[int, Path]:
    """``PREFIX<rank>`` files beside the prefix (regular files, symlinks to them included)."""
    folder = prefix.parent if str(prefix.parent) else Path(".")
    base = prefix.name
    out: dict[int, Path] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        if name.startswith(base) and name[len(base):].isdigit() and (folder / name).is_file():
            out[int(name[len(base):])] = folder / name
    return out


def find_dumps(target: str | None, default_prefix: str) -> DumpSet:
    """The dumps ``target`` names (a directory, a prefix or one dump; None: ``default_prefix``)."""
    if target is None:
        files = _dumps_with(Path(default_prefix))
        if not files:
            raise DumpError(f"no flight-recorder dumps at {default_prefix}<rank>: name their directory or prefix "
                            "(gputop autopsy DIR_OR_PREFIX)")
        return DumpSet(default_prefix, files)
    p = Path(target)
    if p.is_dir():
        return _in_directory(p, default_prefix)
    if p.is_file():
        m = _RANK_SUFFIX.match(p.name)
        if not m:
            raise DumpError(f"{p} is not named as a flight-recorder dump (PREFIX<rank>, e.g. nccl_trace_rank_0)")
        prefix = p.with_name(m.group(1))
        return DumpSet(str(prefix), _dumps_with(prefix))
    if not p.parent.is_dir() and str(p.parent):
        raise DumpError(f"{target}: no such file or directory")
    files = _dumps_with(p)
    if not files:
        raise DumpError(f"no flight-recorder dumps at {target}<rank>")
    return DumpSet(str(target), files)


def _in_directory(folder: Path, default_prefix: str) -> DumpSet:
    """A directory's dumps: its files named ``<prefix><rank>``, with one prefix (the default's
    name where files carry it, else the only one they share)."""
    prefixes: dict[str, set[str]] = {}
    for name in sorted(os.listdir(folder)):
        m = _RANK_SUFFIX.match(name)
        if m and (folder / name).is_file():
            prefixes.setdefault(m.group(1), set()).add(name)
    base = Path(default_prefix).name
    if base in prefixes:
        chosen = base
    elif len(prefixes) == 1:
        chosen = next(iter(prefixes))
    elif not prefixes:
        raise DumpError(f"no flight-recorder dumps in {folder} (files named PREFIX<rank>, e.g. nccl_trace_rank_0)")
    else:
        raise DumpError(f"{folder} holds files of several names ({', '.join(sorted(p + '<rank>' for p in prefixes))}): "
                        f"name the dumps' prefix, e.g. {folder / sorted(prefixes)[0]}")
    return DumpSet(str(folder / chosen), _dumps_with(folder / chosen))


_CUT = "the pickle ends early (a dump still being written, or truncated)"


class _NoClasses(pickle.Unpickler):
    """Plain containers and scalars only: any class or function a pickle names is refused."""

    def find_class(self, module: str, name: str):  # noqa: D102
        raise pickle.UnpicklingError(f"it names {module}.{name}, and a flight-recorder dump names no code")

    def persistent_load(self, pid):  # noqa: D102
        raise pickle.UnpicklingError("it holds persistent ids, which a flight-recorder dump has none of")


def load_dump(path: Path) -> Any:
    """The dump at ``path`` as plain Python data. ``DumpError`` for a file that is not a
    complete pickle of plain data (truncated, another format, or one that names code)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {os_reason(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DumpError(f"{path} is not a regular file")
    if st.st_size > MAX_DUMP_BYTES:
        raise DumpError(f"{path} is {st.st_size >> 20} MB, larger than any flight-recorder dump: not read")
    if st.st_size == 0:
        raise DumpError(f"{path} is empty: the dump was not written (the rank died first, or the disk is full)")
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            if not head.startswith(b"\x80"):
                raise DumpError(f"{path} is not a flight-recorder dump: not a pickle "
                                f"(it starts with {head!r}; the recorder writes pickles)")
            f.seek(0)
            obj = _NoClasses(f).load()
            rest = f.read(1)
    except DumpError:
        raise
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {os_reason(exc)}") from None
    except EOFError:
        raise DumpError(f"{path} is cut short: {_CUT}") from None
    except pickle.UnpicklingError as exc:
        if "truncated" in str(exc):  # the C unpickler's word for a pickle that ends early
            raise DumpError(f"{path} is cut short: {_CUT}") from None
        raise DumpError(f"{path} is not a flight-recorder dump: {exc}") from None
    except Exception as exc:  # a damaged pickle raises whatever its opcodes trip over
        raise DumpError(f"{path} is not a readable flight-recorder dump ({type(exc).__name__}: {exc})") from None
    if rest:
        raise DumpError(f"{path} is not a flight-recorder dump: data follows its pickle")
    return obj


# --------------------------------------------------------------------------- PyTorch's analyzer


def _import_analyzer():
    """torch and the analyzer's logger module; ``AnalyzerUnavailable`` with the reason."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's import-time warnings (numpy) are not the autopsy's
            import torch
    except ImportError:
        raise AnalyzerUnavailable("gputop autopsy needs torch importable, to read the dumps with PyTorch's "
                                  "flight-recorder analyzer (pip install torch)") from None
    except Exception as exc:  # a broken install raises anything on import
        raise AnalyzerUnavailable(f"torch is installed but cannot be imported ({type(exc).__name__}: {exc}): "
                                  "gputop autopsy needs it importable") from None
    try:
        from torch.distributed.flight_recorder.components import fr_logger
    except Exception:
        raise AnalyzerUnavailable(f"torch {getattr(torch, '__version__', '?')} has no flight-recorder analyzer "
                                  "(torch.distributed.flight_recorder): a newer torch has it") from None
    return torch, fr_logger


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # a bad format string in a log call: the line is lost, not the autopsy
            pass


def check_analyzer() -> str:
    """torch's version where PyTorch's analyzer can be imported; ``AnalyzerUnavailable`` otherwise."""
    torch, _ = _import_analyzer()
    return str(getattr(torch, "__version__", "?"))


def run_analyzer(dumps: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """PyTorch's analyzer over the dumps (rank -> dump): ``torch_version``, ``collectives`` (its
    Collective records as dicts), ``log`` (what it logged), ``error`` (why it failed, or None).
    Its matching mutates what it is given: it gets copies."""
    torch, fr_logger = _import_analyzer()
    version = str(getattr(torch, "__version__", "?"))
    logger = fr_logger.FlightRecorderLogger().logger  # the singleton: adds its stderr handler once
    handler = _Collect()
    saved, propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [handler], False
    try:
        try:
            # Imported with the log caught: on import it logs "tabulate is not installed".
            from torch.distributed.flight_recorder.components.builder import build_db
        except Exception:
            raise AnalyzerUnavailable(f"torch {version}'s flight-recorder analyzer cannot be imported "
                                      "(torch.distributed.flight_recorder.components.builder)") from None
        details = {f"rank{r}": {"host_name": f"host_rank{r}", "rank": r, "entries": copy.deepcopy(d["entries"]),
                                "version": d["version"], "pg_config": copy.deepcopy(d["pg_config"])}
                   for r, d in sorted(dumps.items())}
        # The analyzer's options as its command line would set them (it reads them as attributes).
        args = SimpleNamespace(verbose=False, just_print_entries=False, allow_incomplete_ranks=True,
                                  mismatch_cap=10, selected_ranks=None, pg_filters=None, print_stack_trace=False,
                                  transform_ft=False, group_world_size=None)
        version_of_dumps = str(next(iter(dumps.values()))["version"])
        try:
            db = build_db(details, args, version_of_dumps)
        except SystemExit as exc:
            return {"torch_version": version, "error": f"it exited ({exc.code})", "log": handler.lines}
        except Exception as exc:  # research code: any failure is the analyzer's, said in one line
            return {"torch_version": version, "error": f"{type(exc).__name__}: {exc}", "log": handler.lines}
        return {"torch_version": version, "error": None, "log": handler.lines,
                "collectives": [_collective_dict(c) for c in db.collectives]}
    finally:
        logger.handlers, logger.propagate = saved, propagate


def _plain(v: Any) -> Any:
    if isinstance(v, (set, frozenset)):
        return sorted(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)  # MatchInfo: "Error type: COLLECTIVE_TYPE_MISMATCH, ..."


def _collective_dict(c: Any) -> dict[str, Any]:
    d = {k: _plain(v) for k, v in c._asdict().items() if k not in ("mismatch_collectives", "collective_frames")}
    d["mismatch_collectives"] = {int(r): {k: _plain(v) for k, v in m._asdict().items() if k != "collective_frames"}
                                 for r, m in (c.mismatch_collectives or {}).items()}
    return d
