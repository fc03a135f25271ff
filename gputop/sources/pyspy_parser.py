"""py-spy's JSON to ``StackSample``s: frames interned, the leaf and project frames given their
source line (read as the target sees its files, redacted), each stack classified by the
classifier the session passes in.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import psutil

from ..model import Category, Frame, StackSample
from ..redact import redact_code
from .loop_source import LoopFacts, facts_at, read_file

_SOURCE_MAX_BYTES = 4 << 20  # skip reading enormous generated files for line text
_CACHE_MAX = 20000  # interned frames / stacks before the caches start over


class SourceLines:
    """Reads source lines as the target sees its files (through /proc/PID/root, so a target
    in another mount namespace is read correctly), cached per file."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._files: dict[str, list[str] | None] = {}
        self._loops: dict[str, list | None] = {}
        self._cudnn_off: dict[str, int] = {}  # a file's line turning cuDNN off (loop_source.read_file)
        self._started: float | None = None
        # Files changed since the job started: their lines now are not the ones running (an
        # edited script showed a line four lines off as the one that blocks); not read, and said
        # once by the sampler, which empties this list (and ``unparsed``) into events.
        self.stale: list[str] = []
        self.unparsed: list[str] = []  # files whose loops could not be read (not Python that parses)

    def line(self, filename: str, lineno: int) -> str | None:
        if not filename or filename.startswith("<") or lineno <= 0:
            return None
        lines = self._files.get(filename, ...)
        if lines is ...:
            if len(self._files) > 2000:
                self._files.clear()
            lines = self._files[filename] = self._read(filename)
        if lines is None or lineno > len(lines):
            return None
        return lines[lineno - 1].strip() or None

    def loop(self, filename: str, lineno: int) -> tuple[int, tuple[tuple[int, str], ...]]:
        """The innermost loop around ``lineno``: its first line (0: none) and what it keeps from
        turn to turn (``facts``' first two)."""
        facts = self.facts(filename, lineno)
        return facts.loop, facts.keeps

    def facts(self, filename: str, lineno: int) -> LoopFacts:
        """What is read about the innermost loop around ``lineno`` (loop_source): its first line
        (0: none), what it keeps from turn to turn and which of those the backward freed, its
        gradient accumulation, its rank's split of a loaded batch; the file parsed once."""
        if self.line(filename, lineno) is None:
            return LoopFacts()
        loops = self._loops.get(filename, ...)
        if loops is ...:
            if len(self._loops) > 2000:
                self._loops.clear()
                self._cudnn_off.clear()
            text = "\n".join(self._files.get(filename) or ())
            loops, self._cudnn_off[filename] = read_file(text)  # parsed once for both
            self._loops[filename] = loops
            if loops is None:
                self.unparsed.append(filename)
        facts = facts_at(loops, lineno)
        off = self._cudnn_off.get(filename, 0)
        return facts._replace(cudnn_off=off) if off else facts

    def _start_time(self) -> float | None:
        """When the job started (None: unknown, and no file is judged stale)."""
        if self._started is None:
            try:
                self._started = psutil.Process(self.pid).create_time()
            except (psutil.Error, OSError):
                self._started = float("inf")
        return None if self._started == float("inf") else self._started

    def _read(self, filename: str) -> list[str] | None:
        if os.path.isabs(filename):
            candidates = [f"/proc/{self.pid}/root{filename}", filename]
        else:
            candidates = [f"/proc/{self.pid}/cwd/{filename}"]
        for path in candidates:
            try:
                st = os.stat(path)
                if st.st_size > _SOURCE_MAX_BYTES:
                    return None
                started = self._start_time()
                if started is not None and st.st_mtime > started + 1.0:
                    self.stale.append(filename)
                    return None
                with open(path, encoding="utf-8", errors="replace") as f:
                    return f.read().splitlines()
            except OSError:
                continue
        return None


# What the source is given to classify stacks with (the analysis layer's classifier): a stack's
# category from its frames and py-spy's on-CPU flag, and whether a file is library code (whose
# source lines are not read, but for the leaf frame).
Classify = Callable[[Sequence[Frame], bool], Category]
IsLibrary = Callable[[str], bool]


def _unclassified(frames: Sequence[Frame], active: bool) -> Category:
    return Category.OTHER


class StackParser:
    """Turns py-spy's JSON into StackSamples: frames interned (a long session repeats the
    same few stacks), the leaf and project frames given their source line, then classified."""

    def __init__(self, lines: Callable[[str, int], str | None] | None = None, classify: Classify = _unclassified,
                 is_library: IsLibrary = lambda filename: False,
                 facts: Callable[[str, int], LoopFacts] | None = None) -> None:
        self._lines = lines
        self._facts = facts
        self._classify = classify
        self._is_library = is_library
        self._frames: dict[tuple, Frame] = {}
        self._stacks: dict[tuple, tuple[tuple[Frame, ...], dict[bool, object]]] = {}

    def frame(self, raw: dict, leaf: bool) -> Frame:
        name = str(raw.get("name") or "?")
        filename = str(raw.get("filename") or "")
        line = int(raw.get("line") or 0)
        key = (name, filename, line, leaf)
        f = self._frames.get(key)
        if f is None:
            code = None
            own = not self._is_library(filename)
            if self._lines is not None and (leaf or own):
                code = self._lines(filename, line)
                if code:
                    # Redacted here, once per distinct line (redact_code caches): every frame on
                    # screen, in `stacks --json`, in the advisor's evidence and in a recording
                    # comes from this one.
                    code = redact_code(code)
            facts = self._facts(filename, line) if self._facts is not None and own else LoopFacts()
            # The source's statements redacted here too, as the line above (each is shown and recorded).
            loop, freed = facts.loop, facts.freed
            keeps = tuple((ln, redact_code(text)) for ln, text in facts.keeps)
            accum = (*facts.accum[:2], redact_code(facts.accum[2]), *facts.accum[3:]) if facts.accum else ()
            shard = (facts.shard[0], redact_code(facts.shard[1])) if facts.shard else ()
            f = Frame(name=name, filename=filename, line=line, module=raw.get("module"), code=code, keeps=keeps,
                      loop=loop, freed=freed, accum=accum, shard=shard, cudnn_off=facts.cudnn_off)
            if len(self._frames) > _CACHE_MAX:
                self._frames.clear()
            self._frames[key] = f
        return f

    def samples(self, data: list[dict], ts: float) -> list[StackSample]:
        out: list[StackSample] = []
        for th in data:
            raw_frames = th.get("frames") or []
            key = tuple((fr.get("name"), fr.get("filename"), fr.get("line")) for fr in raw_frames)
            cached = self._stacks.get(key)
            if cached is None:
                frames = tuple(self.frame(fr, i == 0) for i, fr in enumerate(raw_frames))
                if len(self._stacks) > _CACHE_MAX:
                    self._stacks.clear()
                cached = self._stacks[key] = (frames, {})
            frames, cats = cached
            active = bool(th.get("active", True))
            cat = cats.get(active)
            if cat is None:
                cat = cats[active] = self._classify(frames, active)
            pid = int(th.get("pid") or 0)
            os_tid = th.get("os_thread_id")
            name = str(th.get("thread_name") or "")
            out.append(
                StackSample(
                    ts=ts,
                    pid=pid,
                    thread_id=int(th.get("thread_id") or 0),
                    thread_name=name,
                    frames=frames,
                    active=active,
                    owns_gil=bool(th.get("owns_gil", False)),
                    is_main=(os_tid == pid) if os_tid is not None else name == "MainThread",
                    category=cat,  # type: ignore[arg-type]
                    os_thread_id=int(os_tid) if os_tid is not None else None,
                )
            )
        out.sort(key=lambda s: not s.is_main)
        return out


__all__ = ["Classify", "IsLibrary", "SourceLines", "StackParser"]
