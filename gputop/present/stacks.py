"""Text of the stacks pane and of ``gputop stacks``. Pure: views in, lines out.

A line is a tuple of (text, style) segments. Style names are semantic ("project", "lib",
"bad", "cat.data-wait", ...): the widget maps them to colours, ``plain()`` drops them, so the
same functions serve the terminal UI, stdout and the tests.
"""

from __future__ import annotations

import textwrap
from typing import Iterable, Mapping, Sequence

from ..analysis import Hot, StacksView, WorkerView
from ..analysis import StuckVerdict
from ..analysis import is_library, own_frames, short_path, where
from ..units import fmt_bytes, fmt_clock, fmt_duration, fmt_pct, truncate
from ..model import Category, Frame, ProcSample, StackSample

Seg = tuple[str, str]
Line = tuple[Seg, ...]

MAX_MAIN_FRAMES = 40
MAX_OTHER_FRAMES = 8  # idle helper threads are mostly threading.py boilerplate

# Glyph per category for the bar, so it reads without colour too (NO_COLOR, plain text).
CATEGORY_GLYPH = {
    Category.DATA_WAIT: "▓",
    Category.DATA_FETCH: "▒",
    Category.HOST_SYNC: "█",
    Category.H2D_COPY: "▚",
    Category.FORWARD: "▉",
    Category.BACKWARD: "▊",
    Category.OPTIMIZER: "▋",
    Category.COLLECTIVE: "▞",
    Category.CHECKPOINT_IO: "▙",
    Category.GC: "▟",
    Category.IDLE: "░",
    Category.OTHER: "▌",
}


def line(*segs: Seg | str) -> Line:
    return tuple(s if isinstance(s, tuple) else (s, "") for s in segs)


def plain(lines: Iterable[Line]) -> str:
    return "\n".join("".join(t for t, _ in ln).rstrip() for ln in lines)


def cat_seg(c: Category | None) -> Seg:
    if c is None:
        return ("?", "dim")
    return (c.value, f"cat.{c.value}")


# --------------------------------------------------------------------------- stacks


def frame_line(f: Frame, marker: str = "    ") -> Line:
    """py-spy's own layout, 'function (file:line)', plus the line's code for project frames."""
    proj = not is_library(f.filename)
    segs: list[Seg] = [
        (marker, "project" if proj else "dim"),
        (f.name, "project" if proj else "lib"),
        (f" ({short_path(f.filename)}:{f.line})", "path" if proj else "dim"),
    ]
    if proj and f.code:
        segs += [("  ", ""), (truncate(f.code, 80), "code")]
    return tuple(segs)


def thread_header(s: StackSample) -> Line:
    tid = s.os_thread_id if s.os_thread_id is not None else s.thread_id
    segs: list[Seg] = [(f"{s.thread_name or 'thread'}", "title"), (f" {tid}", "dim")]
    if s.is_main:
        segs.append((" (main)", "dim"))
    segs += [("  ", ""), cat_seg(s.category)]
    if s.category is not Category.IDLE:
        # py-spy's flag: off-CPU means blocked in a syscall or on a lock.
        segs.append(("  on-CPU" if s.active else "  off-CPU", "dim"))
    if s.owns_gil:
        segs.append((" +GIL", "dim"))
    return tuple(segs)


# In place of a stack's frames when a cut copy of a recording lost them (``Reader.lost("frames")``):
# an empty stack there is the cut's doing, not a measurement of the job.
FRAMES_LOST = {"lost": "frames lost in the cut", "partly": "no Python frames, or lost in the cut"}


def stack_lines(s: StackSample, max_frames: int | None = MAX_MAIN_FRAMES, frames_lost: str | None = None) -> list[Line]:
    """A thread: header, then its frames newest first (project frames marked ▸). A forked
    worker's frames inherited from its parent are left out."""
    out = [thread_header(s)]
    own = own_frames(s.frames)
    frames = own if max_frames is None else own[:max_frames]
    if not own:
        out.append(line((f"    ({FRAMES_LOST.get(frames_lost or '', 'no Python frames')})", "dim")))
    for f in frames:
        out.append(frame_line(f, "  ▸ " if not is_library(f.filename) else "    "))
    if len(frames) < len(own):
        out.append(line((f"    … {len(own) - len(frames)} older frames", "dim")))
    if len(own) < len(s.frames):
        out.append(line((f"    … {len(s.frames) - len(own)} frames of the parent at fork time", "dim")))
    return out


def top_frame_text(s: StackSample | None) -> str:
    if s is None or not s.frames:
        return "—"
    f = s.frames[0]
    return f"{f.name} ({short_path(f.filename)}:{f.line})"


# --------------------------------------------------------------------------- window summaries


def category_bar(shares: Sequence[tuple[Category, float]], width: int) -> list[Line]:
    """One bar of the main thread's time by category, then its legend."""
    width = max(10, width)
    if not shares:
        return [line(("no samples yet", "dim"))]
    segs: list[Seg] = []
    used = 0
    for i, (c, share) in enumerate(shares):
        n = width - used if i == len(shares) - 1 else round(share * width)
        n = max(0, min(n, width - used))
        if n:
            segs.append((CATEGORY_GLYPH[c] * n, f"cat.{c.value}"))
            used += n
    legend: list[Seg] = []
    for c, share in shares:
        if legend:
            legend.append(("  ", ""))
        legend += [(CATEGORY_GLYPH[c] + " ", f"cat.{c.value}"), (c.value, f"cat.{c.value}"), (f" {share * 100:.0f}%", "")]
    return [tuple(segs), tuple(legend)]


def hot_lines(hot: Sequence[Hot], frames_lost: str | None = None) -> list[Line]:
    out: list[Line] = []
    for h in hot:
        segs: list[Seg] = [
            (f"{h.share * 100:5.1f}%  ", "num"),
            (h.category.value.ljust(13), f"cat.{h.category.value}"),
        ]
        if not h.frame.filename:  # the samples with no frame (the summary's "<no Python frames>")
            segs.append((f"<{FRAMES_LOST[frames_lost]}>" if frames_lost in FRAMES_LOST else h.frame.name, "dim"))
            out.append(tuple(segs))
            continue
        proj = not is_library(h.frame.filename)
        segs.append((f"{h.frame.name} ({short_path(h.frame.filename)}:{h.frame.line})", "project" if proj else "lib"))
        if h.via is not None:
            segs.append((f"  ← {short_path(h.via.filename)}:{h.via.line} {h.via.name}", "project"))
        out.append(tuple(segs))
    return out


def worker_lines(workers: Sequence[WorkerView]) -> list[Line]:
    if not workers:
        return [line(("no worker processes", "dim"))]
    out = [line(("    PID    CPU  STATE     DOING          TOP FRAME", "dim"))]
    for w in workers:
        p, st = w.proc, w.stack
        top = st.frames[0] if st is not None and st.frames else None
        out.append(
            line(
                f"{p.pid:>7} {fmt_pct(p.cpu_percent, 5)}  {(p.status or '?')[:8]:<8}  ",
                cat_seg(st.category) if st is not None else ("—", "dim"),
                " " * max(1, 15 - (len(st.category.value) if st is not None else 1)),
                (top_frame_text(st), "project" if top is not None and not is_library(top.filename) else "lib"),
            )
        )
    return out


def doing(s: StackSample) -> str:
    return f"{s.category.value} at {where(s.frames)}"


def stuck_lines(v: StuckVerdict, pid: int, native_key: str | None = "n") -> list[Line]:
    """The plain statement of a stuck job: where, for how long, and what everything else does."""
    held = ("≥ " if not v.held_exact else "") + fmt_duration(v.held_s)
    since = f" (since {fmt_clock(v.since)})" if v.since else ""
    out = [
        line((f"STUCK: PID {pid} has not moved for {held}{since}", "bad"),
             (f"   confidence {v.confidence * 100:.0f} %" if v.confidence else "", "dim")),
        line(("  at ", ""), (v.where, "bad"), ("   ", ""), cat_seg(v.category), (f"   GPU: {v.gpu}", "dim")),
    ]
    if v.at is not None and v.at.code:
        out.append(line(("     ", ""), (v.at.code, "code")))
    if v.frame is not None and v.frame is not v.at:
        out.append(line(("  newest frame: ", "dim"), (f"{v.frame.name} ({short_path(v.frame.filename)}:{v.frame.line})", "lib")))
    d = v.diagnosis
    if d is not None:
        # Why (the kind of hang) and where every party waits, the kernel's word beside each.
        out.append(line(("  why: ", ""), (f"{d.kind}: ", "bad"), (d.summary, "")))
        for e in d.evidence:
            out.append(line(("       ", ""), (e, "dim")))
        for p in d.parties[1:]:
            cat = f"{p.category.value} at " if p.category is not None else ""
            out.append(line((f"  {p.label}".ljust(30), ""), (f"{cat}{p.where}", "project"), (f"  {p.what}", "dim")))
        out.append(line(("  next: ", ""), (d.action, "action")))
    else:
        for s in v.others:
            who = f"  thread {s.thread_name or s.thread_id}" if s.pid == pid else f"  worker {s.pid} {s.thread_name}"
            out.append(line((who.ljust(30), ""), (doing(s), "dim")))
    for e in v.evidence:
        out.append(line(("  evidence: ", "dim"), (e, "dim")))
    if native_key:
        out.append(line((f"  press {native_key} for a native (C/C++/CUDA) stack dump (~0.6 s)", "dim")))
    return out


def target_line(p: ProcSample | None, pid: int) -> Line:
    if p is None:
        return line((f"PID {pid}", "title"))
    segs: list[Seg] = [(f"PID {pid}", "title"), ("  ", "")]
    segs.append((truncate(p.cmdline or p.name, 70), ""))
    if p.status != "exited":
        segs.append((f"   CPU {fmt_pct(p.cpu_percent)}  RSS {fmt_bytes(p.rss)}  threads {p.num_threads or '?'}", "dim"))
    return tuple(segs)


# --------------------------------------------------------------------------- whole pane / dump


def stacks_waiting_lines(pid: int, native: Sequence[str] = ()) -> list[Line]:
    """The pane for a target whose first view is not in yet (the views stage looks each second)."""
    out: list[Line] = [line((f"PID {pid}", "title")), (), line(("reading its stacks …", "dim"))]
    if native:
        out.append(())
        out.extend(line((t, "native")) for t in native)
    return out


def stacks_pane_lines(view: StacksView, width: int = 100, native: Sequence[str] = (),
                      frames_lost: str | None = None) -> list[Line]:
    """Everything the stacks pane shows, top to bottom. ``frames_lost``: a cut recording's frames
    were lost (``Reader.lost("frames")``): said, and a stack without frames read as the cut's."""
    out: list[Line] = [target_line(view.target, view.pid)]
    if frames_lost in FRAMES_LOST:
        which = "The" if frames_lost == "lost" else "Part of the"
        text = (f"{which} recording's stack frames were lost in the cut: each sample's category is as recorded, "
                "where in the code it was is not known.")
        out.extend(line((t, "warn")) for t in textwrap.wrap(text, max(20, width), break_on_hyphens=False))
    if view.fault is not None:
        # Wrapped, not cut at the pane's edge: why there are no stacks, and its remedy, is the
        # end of the message.
        style = "bad" if view.fault.level == "error" else "warn"
        lead = f"{fmt_clock(view.fault.ts)}  "
        out.extend(line((t, style)) for t in textwrap.wrap(view.fault.message, max(20, width), initial_indent=lead,
                                                          subsequent_indent=" " * len(lead), break_on_hyphens=False))
    if view.verdict.stuck:
        out.append(())
        out.extend(stuck_lines(view.verdict, view.pid))
    if view.fault is not None and view.fault.level == "error" and not view.samples and not view.threads:
        # Nothing was ever sampled and the reason is above: the empty sections would only read
        # as "still waiting".
        out.append(line(("No stacks: the reason is on the line above. GPU and host monitoring go on.", "dim")))
        return out
    out.append(())
    out.append(line((f"Main thread, last {fmt_duration(view.span_s)} ", "head"), (f"({view.samples} samples)", "dim")))
    out.extend(category_bar(view.shares, width - 2))
    main = [s for s in view.threads if s.is_main]
    others = [s for s in view.threads if not s.is_main]
    if main:
        out.append(())
        out.append(line(("Current stack", "head"), (f"  {fmt_clock(main[0].ts)}", "dim")))
        out.extend(stack_lines(main[0], frames_lost=frames_lost))
    if view.hot:
        out.append(())
        out.append(line(("Hottest frames (main thread)", "head")))
        out.extend(hot_lines(view.hot, frames_lost))
    if others:
        out.append(())
        out.append(line((f"Other threads ({len(others)})", "head")))
        for s in others:
            out.extend(stack_lines(s, MAX_OTHER_FRAMES, frames_lost))
    out.append(())
    out.append(line((f"Workers ({len(view.workers)})", "head")))
    out.extend(worker_lines(view.workers))
    if native:
        out.append(())
        out.extend(line((t, "native")) for t in native)
    return out


def dump_text(view: StacksView, ranks: Mapping[int, int] | None = None) -> str:
    """``gputop stacks``: every thread and worker with its category, full stacks. ``ranks``: a
    multi-rank job's pid -> rank, its processes named as ranks (not as DataLoader workers)."""
    ranks = ranks or {}
    out: list[Line] = [target_line(view.target, view.pid)]
    if view.fault is not None:
        out.append(line(view.fault.message))
    for s in view.threads:
        out.append(())
        out.extend(stack_lines(s, None))
    for w in view.workers:
        out.append(())
        p = w.proc
        # The process's state is its main thread's at the moment psutil read it; the threads below
        # are each as py-spy caught them, a moment apart ("sleeping" above an on-CPU thread read
        # as a contradiction).
        who = f"rank {ranks[p.pid]} PID" if p.pid in ranks else "worker PID"
        out.append(line(f"{who} {p.pid}  CPU {fmt_pct(p.cpu_percent)}  main thread {p.status or '?'} when read"))
        for s in w.threads:
            out.extend(stack_lines(s, None))
    return plain(out) + "\n"


def _frame_dict(f: Frame) -> dict:
    return {"name": f.name, "file": f.filename, "line": f.line, "code": f.code, "project": not is_library(f.filename)}


def _thread_dict(s: StackSample) -> dict:
    return {
        "pid": s.pid,
        "thread_id": s.thread_id,
        "os_thread_id": s.os_thread_id,
        "name": s.thread_name,
        "main": s.is_main,
        "active": s.active,
        "owns_gil": s.owns_gil,
        "category": s.category.value,
        "where": where(s.frames),
        "frames": [_frame_dict(f) for f in s.frames],
    }


def dump_dict(view: StacksView, ranks: Mapping[int, int] | None = None) -> dict:
    """``gputop stacks --json``; ``ranks`` as for ``dump_text`` (each process's "rank", None for a
    DataLoader worker)."""
    ranks = ranks or {}
    t = view.target
    return {
        "pid": view.pid,
        "ts": view.threads[0].ts if view.threads else view.now,
        "cmdline": t.cmdline if t else None,
        "threads": [_thread_dict(s) for s in view.threads],
        "workers": [
            {
                "pid": w.proc.pid,
                "rank": ranks.get(w.proc.pid),
                "cpu_percent": w.proc.cpu_percent,
                "status": w.proc.status,
                "category": w.stack.category.value if w.stack else None,
                "threads": [_thread_dict(s) for s in w.threads],
            }
            for w in view.workers
        ],
        "fault": view.fault.message if view.fault else None,
    }
