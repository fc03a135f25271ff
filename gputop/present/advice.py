"""Findings and time breakdowns as text, bar segments and JSON. Pure: no Textual, no I/O.

The advise command prints these; the advisor pane draws the same segments and lines, so the
two never disagree.
"""

from __future__ import annotations

import textwrap
from typing import Iterable, Mapping, Sequence

from ..advisor import MIN_COST_FRACTION, gain_times
from ..analysis import BUCKET_LABELS, CPU_DEVICE, Breakdown, Bucket, whole_percentages
from ..model import Evidence, Finding, Severity
from ..units import fmt_seconds, truncate

SEVERITY_MARK = {Severity.CRITICAL: "!! ", Severity.WARNING: "! ", Severity.INFO: "i "}
# One character per bucket in a monochrome bar (the pane colours them as well).
BUCKET_CHAR = {
    Bucket.BUSY: "█",
    Bucket.DATA: "D",
    Bucket.CPU: "C",
    Bucket.SYNC: "S",
    Bucket.H2D: "H",
    Bucket.IO: "I",
    Bucket.COLLECTIVE: "N",
    Bucket.CHECKPOINT: "K",
    Bucket.UNKNOWN: "·",
}


def device_name(bd: Breakdown) -> str:
    return "CPU (no GPU)" if bd.gpu_index == CPU_DEVICE else f"GPU {bd.gpu_index}"


def breakdown_rows(bd: Breakdown) -> list[tuple[Bucket, float, int]]:
    """(bucket, seconds, whole percent) in display order, buckets with time only; the
    percentages add up to 100."""
    pcts = whole_percentages(bd.seconds)
    return [(b, bd.get(b), pcts.get(b, 0)) for b in Bucket if bd.get(b) > 0]


def bar_segments(bd: Breakdown, width: int) -> list[tuple[Bucket, int]]:
    """Cells per bucket for a bar ``width`` wide; they add up to ``width`` exactly."""
    if width <= 0 or bd.total_s <= 0:
        return []
    raw = {b: width * bd.get(b) / bd.total_s for b in Bucket if bd.get(b) > 0}
    cells = {b: int(v) for b, v in raw.items()}
    order = sorted(raw, key=lambda b: (-(raw[b] - cells[b]), list(Bucket).index(b)))
    for b in order[: width - sum(cells.values())]:
        cells[b] += 1
    return [(b, cells[b]) for b in Bucket if cells.get(b)]


def bar_text(bd: Breakdown, width: int) -> str:
    return "".join(BUCKET_CHAR[b] * n for b, n in bar_segments(bd, width))


def breakdown_summary(bd: Breakdown) -> str:
    """One line: 'GPU 0 over 58 s: busy 52 %, waiting for data 41 %, other/unknown 7 %'."""
    parts = [f"{BUCKET_LABELS[b]} {p} %" for b, _, p in breakdown_rows(bd)]
    return f"{device_name(bd)} over {fmt_seconds(bd.total_s)}: " + ", ".join(parts)


# Said when at least this much of a window is the GPU's history from before the session: less is
# the first poll's own 200 ms points reaching back one period.
BEFORE_START_NOTE_S = 0.5


def before_start_s(bd: Breakdown, session_start: float | None) -> float:
    """Seconds of ``bd``'s window from before the session started: NVML hands the first poll its
    buffer of the GPU's utilisation, ~14 s from before gputop ran, and a window not attached to
    a job's stacks starts in it. 0 when none, or the start is unknown."""
    if session_start is None:
        return 0.0
    return max(0.0, min(bd.t1, session_start) - bd.t0)


def before_start_note(bd: Breakdown, session_start: float | None) -> str:
    """', 14 s of it from before the session (the GPU's buffer)' where that is so, else ''. Said
    too for less than BEFORE_START_NOTE_S where it is what makes the window's whole seconds more
    than the session's: `advise -d 15` read "watched 15 s", then "over the last 16 s" unexplained."""
    pre = before_start_s(bd, session_start)
    longer = pre > 0 and fmt_seconds(bd.total_s) != fmt_seconds(max(0.0, bd.total_s - pre))
    return (f", {fmt_seconds(pre)} of it from before the session (the GPU's buffer)"
            if pre >= BEFORE_START_NOTE_S or longer else "")


# How far before a window a poll is looked for, to tell a session older than the window from one
# that began inside it: a minute, or three polls at a longer interval (a poll missed, the GPU
# briefly lost, is not taken for the session's start).
SESSION_LOOKBACK_S = 60.0


def session_start_in(store, breakdowns: Sequence[Breakdown]) -> float | None:
    """When the session's GPU polls begin, where that is inside the breakdowns' window (None: the
    polls reach back before it, or there are none in it). A poll is taken live, never from the
    buffer, so the first one is the session's start. ``store``: a ``Store`` (or its view); only
    the window's polls and those just before it are read."""
    gpu_bds = [bd for bd in breakdowns if bd.gpu_index >= 0]
    if not gpu_bds:
        return None
    t0, t1 = min(bd.t0 for bd in gpu_bds), max(bd.t1 for bd in gpu_bds)
    firsts = []
    for i in store.gpu_indices():
        polls = store.gpu_window(i, t0, t1)
        if not polls:
            continue
        gap = polls[1].ts - polls[0].ts if len(polls) > 1 else t1 - t0
        if store.gpu_window(i, t0 - max(SESSION_LOOKBACK_S, 3 * gap), t0 - 1e-9):
            return None  # polled before the window: none of it predates the session
        firsts.append(polls[0].ts)
    return min(firsts, default=None)


def breakdown_table(bds: Sequence[Breakdown], session_start: float | None = None) -> str:
    """A table per device: bucket, seconds, percent (adding up to 100), and the bar."""
    lines: list[str] = []
    for bd in bds:
        if bd.total_s <= 0:
            continue
        note = "" if bd.attributed else "  (no stack samples: idle time not attributed)"
        lines.append(f"{device_name(bd)}: where the time went over the last {fmt_seconds(bd.total_s)}"
                     f"{before_start_note(bd, session_start)}{note}")
        lines.append("  " + bar_text(bd, 50))
        for b, s, p in breakdown_rows(bd):
            lines.append(f"  {BUCKET_CHAR[b]} {BUCKET_LABELS[b]:<32} {s:7.1f} s  {p:3d} %")
    return "\n".join(lines)


def cost_text(f: Finding) -> str:
    """What the cause cost: GPU-seconds when it is about a GPU; for a job with no GPU (the
    training thread stands in for the device) seconds of the job's own time."""
    if f.gpu_index is not None and f.gpu_index >= 0:
        return f"cost {f.cost_s:.1f} GPU-s"
    return f"cost {f.cost_s:.1f} s of the job's time"


def finding_lines(f: Finding, rank: int | None = None, width: int = 100, since: float | None = None) -> list[str]:
    """A finding as text: title line, then evidence, action and expected gain, wrapped."""
    head = f"{rank}. " if rank is not None else ""
    meta = f"[{f.severity.value}, confidence {f.confidence:.0%}"
    if f.cost_s > 0:
        meta += f", {cost_text(f)}"
    if since is not None and f.first_seen:
        meta += f", since +{fmt_seconds(max(0.0, f.first_seen - since))}"
    meta += "]"
    out = [f"{SEVERITY_MARK.get(f.severity, '  ')}{head}{f.title}  {meta}"]
    ind = " " * (len(head) + 4)
    for e in f.evidence:
        out.extend(textwrap.wrap(e, width, initial_indent=ind + "- ", subsequent_indent=ind + "  ", break_on_hyphens=False))
    out.extend(textwrap.wrap(f.action, width, initial_indent=ind + "do: ", subsequent_indent=ind + "    ",
                             break_on_hyphens=False))
    if f.expected_gain:
        out.extend(textwrap.wrap(f.expected_gain, width, initial_indent=ind + "gain: ", subsequent_indent=ind + "      ",
                                 break_on_hyphens=False))
    return out


def collecting_text(ev: Evidence | None, stacks_readable: bool = True) -> str | None:
    """What the advisor is still collecting before its first verdict, as one sentence; None when
    it has enough (or nothing is known)."""
    if ev is None or ev.enough(stacks_readable):
        return None
    parts = []
    if ev.stacks is not None and stacks_readable:
        parts.append(f"{ev.stacks} of ~{ev.stacks_needed} stacks of the job's main thread")
    if ev.gpu_s is not None:
        parts.append(f"{ev.gpu_s:.1f} of {ev.gpu_needed_s:g} s of GPU samples")
    return f"Collecting evidence: {', '.join(parts)}. Findings come once there is enough to judge."


def unnamed_wait(breakdowns: Sequence[Breakdown], pid: int | None = None) -> str | None:
    """With no findings, the largest wait the breakdown attributes (a named bucket, not busy nor
    other/unknown) that is past the advisor's cost bar, as a sentence: the wait is measured but no
    rule had the evidence that tells its cause from its look-alikes. None when there is none.
    "Nothing costs the job a visible share of its time" beside a bar that shows 100 % waiting for
    data denied what the same output showed."""
    best: tuple[float, Breakdown, Bucket] | None = None
    for bd in breakdowns:
        if bd.total_s <= 0:
            continue
        for b in Bucket:
            if b in (Bucket.BUSY, Bucket.UNKNOWN):
                continue
            share = bd.get(b) / bd.total_s
            if share >= MIN_COST_FRACTION and (best is None or share > best[0]):
                best = (share, bd, b)
    if best is None:
        return None
    share, bd, b = best
    weighed = _WEIGHED.get(b)
    look = f" ({weighed})" if weighed else ""
    return (f"No finding names a cause, but {device_name(bd)} is {BUCKET_LABELS[b]} {100 * share:.0f} % of the window: no "
            f"rule had the evidence that tells why from its look-alikes{look}. `gputop stacks --pid {pid or 'PID'}` "
            "shows where the job's threads and workers wait now.")


# What tells the cause of each wait from its look-alikes: said with a wait no rule named, so the
# reader knows what was weighed (a collective wait was explained with a data wait's).
_WEIGHED = {
    Bucket.DATA: "for a data wait: the loader workers' CPU and stacks, the host's CPU, iowait and disk reads",
    Bucket.COLLECTIVE: "for a collective wait: which rank the others wait for (each rank's stacks, its GPU), or "
                       "what every rank sends (NVLink and PCIe traffic); part of it is the all-reduce every "
                       "data-parallel step pays, healthy on its own",
    Bucket.SYNC: "for syncs: the line that reads a value from the device, and whether it recurs every step",
    Bucket.H2D: "for copies: pinned memory, the copies' sizes, PCIe traffic",
    Bucket.CHECKPOINT: "for saves: the save's line and how often it recurs",
    Bucket.CPU: "for CPU work: one function of the job's own, and whether the GPU's kernels fill it",
    Bucket.IO: "for IO: the disks' reads and which process makes them",
}


_NO_JOB_GPUS = ("No findings: no job is attached (--pid PID), so none is judged, and no GPU was idle a visible "
                "share of this window.")
_NO_JOB_NO_GPU = ("No findings: no job is attached (--pid PID) and no GPU was read: there is nothing to judge. "
                  "Attach to the training process with --pid PID.")


def findings_text(findings: Sequence[Finding], width: int = 100, since: float | None = None,
                  collecting: Evidence | None = None, breakdowns: Sequence[Breakdown] = (),
                  pid: int | None = None, attached: bool = True) -> str:
    """``collecting``: the advisor had too little to go on for a verdict (``Verdict.collecting``):
    said instead of "no findings". ``breakdowns``: a wait they show past the cost bar is said
    (``unnamed_wait``) instead of "nothing costs the job". ``attached``: False when no job is
    (`advise` without --pid): "no job attached" rather than a claim about a job there is not."""
    if not findings:
        wait = unnamed_wait(breakdowns, pid)
        return (collecting_text(collecting) or (textwrap.fill(wait, width) if wait else None)
                or (None if attached else textwrap.fill(_NO_JOB_GPUS if breakdowns else _NO_JOB_NO_GPU, width))
                or "No findings: nothing in this window costs the job a visible share of its time.")
    blocks = ["\n".join(finding_lines(f, i + 1, width, since)) for i, f in enumerate(findings)]
    return "\n\n".join(blocks)


def finding_gpu(f: Finding) -> int | None:
    """The GPU a finding is about for JSON and labels: None for none, and for a job with no GPU,
    whose training thread stands in for the device (``CPU_DEVICE``, -1, is not a GPU's index)."""
    return f.gpu_index if f.gpu_index is not None and f.gpu_index != CPU_DEVICE else None


def finding_dict(f: Finding, since: float | None = None) -> dict:
    d = {
        "id": f.id,
        "title": f.title,
        "severity": f.severity.value,
        "confidence": f.confidence,
        "cost_s": f.cost_s,
        "gpu_index": finding_gpu(f),
        "evidence": list(f.evidence),
        "action": f.action,
        "expected_gain": f.expected_gain,
        "gain_predicted": f.gain_predicted,
    }
    if since is not None:
        d["first_seen_s"] = round(f.first_seen - since, 2) if f.first_seen else None
    return d


def breakdown_dict(bd: Breakdown) -> dict:
    pcts = whole_percentages(bd.seconds)
    return {
        "device": device_name(bd),
        "gpu_index": None if bd.gpu_index == CPU_DEVICE else bd.gpu_index,
        "window_s": round(bd.total_s, 2),
        "attributed": bd.attributed,
        "buckets": [
            {"id": b.value, "label": BUCKET_LABELS[b], "seconds": round(bd.get(b), 3), "percent": pcts.get(b, 0)}
            for b in Bucket
            if bd.get(b) > 0
        ],
    }


def report_dict(
    findings: Sequence[Finding],
    breakdowns: Iterable[Breakdown],
    since: float,
    history: Mapping[str, tuple[float, float]] | None = None,
    extra: Mapping[str, object] | None = None,
) -> dict:
    """The JSON the advise command prints: findings ranked, each with the time it first
    appeared relative to ``since`` (the start), the breakdowns, and every finding seen."""
    out: dict = dict(extra or {})
    out["findings"] = [finding_dict(f, since) for f in findings]
    out["top"] = findings[0].id if findings else None
    out["breakdown"] = [breakdown_dict(b) for b in breakdowns if b.total_s > 0]
    if history is not None:
        out["seen"] = [
            {"id": fid, "first_seen_s": round(a - since, 2), "last_seen_s": round(b - since, 2)}
            for fid, (a, b) in sorted(history.items(), key=lambda kv: kv[1][0])
        ]
    return out


# --------------------------------------------------------------------------- the pane's lines

# A line is a tuple of (text, style) segments; styles are semantic names the pane maps to
# colours: "title", "dim", "num", "action", "sev.<severity>", "bucket.<bucket>".
Segment = tuple[str, str]
Line = tuple[Segment, ...]


def breakdown_lines(bd: Breakdown, width: int, session_start: float | None = None) -> list[Line]:
    """The bar (coloured per bucket) and a legend with percentages that add up to 100."""
    bar_w = max(10, width - 24)
    head: Line = (
        (f"{device_name(bd)} ", "title"),
        (f"last {fmt_seconds(bd.total_s)}{before_start_note(bd, session_start)}", "dim"),
        ("" if bd.attributed else "  idle not attributed (no stacks)", "dim"),
    )
    bar: Line = tuple((BUCKET_CHAR[b] * n, f"bucket.{b.value}") for b, n in bar_segments(bd, bar_w))
    # The legend flows onto as many lines as the width needs, one bucket never split.
    legends: list[list[Segment]] = [[]]
    used = 0
    for b, _, p in breakdown_rows(bd):
        item = [(f"{BUCKET_CHAR[b]} ", f"bucket.{b.value}"), (f"{BUCKET_LABELS[b]} ", ""), (f"{p} %", "num")]
        n = sum(len(t) for t, _ in item)
        if legends[-1] and used + 3 + n > width:
            legends.append([])
            used = 0
        if legends[-1]:
            legends[-1].append(("   ", ""))
            used += 3
        legends[-1].extend(item)
        used += n
    return [head, bar, *(tuple(seg) for seg in legends)]


def _wrapped(text: str, width: int, label: str, label_style: str, style: str) -> list[Line]:
    """``text`` under ``label``, every line (label or indent included) at most ``width`` cells.
    Lines break at spaces only, never inside a token such as ``k,`` or ``--shm-size``, so code
    reads as it must be typed; a single token wider than the pane is the one thing split."""
    indent = " " * len(label)
    chunks = textwrap.wrap(text, max(10, width - len(label)), break_on_hyphens=False) or [""]
    return [((label, label_style) if j == 0 else (indent, ""), (chunk, style)) for j, chunk in enumerate(chunks)]


def _plain(ln: Line) -> str:
    return "".join(t for t, _ in ln)


def finding_starts(lines: Sequence[Line]) -> list[int]:
    """Row of each finding's title line in ``advice_pane_lines``' output, in rank order."""
    return [i for i, ln in enumerate(lines) if ln and ln[0][1].startswith("sev.")]


# Other/unknown time at least this share of a breakdown: "no findings" says what is not known
# rather than "nothing costs the job". Judgement: the advisor's own cost bar (a tenth) would
# flag less; a quarter of the time unexplained is not a healthy job's.
UNEXPLAINED_SHARE = 0.25


def cut_findings_text(findings_lost: str | None) -> str | None:
    """What a replay with no finding of its own says of a cut copy's recorded findings, in the
    words info and the report use (``findings_lost``: ``Reader.lost("findings")``); None for a
    whole file. "Nothing costs the job" would claim what the cut took could not be checked."""
    if findings_lost == "lost":
        return "no findings in what survived the cut: the recorded ones were lost in the cut"
    if findings_lost == "partly":
        return "no findings in what survived the cut (more may have been lost in the cut)"
    return None


def verdict_line(findings: Sequence[Finding], width: int, pending: Sequence[Finding] = (),
                 collecting: Evidence | None = None, exited: str | None = None,
                 no_stacks: str | None = None, findings_lost: str | None = None) -> Line:
    """The attached job's verdict in one line, for every screen: the Advisor tab's top finding
    (never another), or what it is still weighing or collecting. ``no_stacks``: why the job's
    stacks cannot be read (not Python, no permission): said rather than "collecting" stacks that
    never come. ``findings_lost``: a cut recording's findings were lost (``cut_findings_text``)."""
    if exited is not None:
        text, style = f"the attached job exited ({exited})", "warn"
        if findings:
            text += f"; last: {findings[0].title}"
        return ((truncate(text, width), style),)
    if findings:
        f = findings[0]
        more = f" (+{len(findings) - 1})" if len(findings) > 1 else ""
        # The advisor's own formatter: "100x" as the gain's text says it, never "1e+02x".
        bound = f" · at most {gain_times(f.gain_predicted)}" if f.gain_predicted and f.gain_predicted > 1 else ""
        tail = f"{bound}{more} · 2: details"
        head = SEVERITY_MARK.get(f.severity, "  ")
        room = max(10, width - len(head) - len(tail))
        return ((head, f"sev.{f.severity.value}"), (truncate(f.title, room), "title"), (tail, "dim"))
    if pending:
        return ((truncate(f"weighing: {'; '.join(p.title for p in pending[:2])}", width), "dim"),)
    wait = collecting_text(collecting, stacks_readable=no_stacks is None)
    if wait is not None:
        return ((truncate(wait, width), "dim"),)
    if no_stacks is not None:
        return ((truncate(f"no stacks ({no_stacks}): GPU and host monitoring only, no cause can be named", width),
                 "warn"),)
    cut = cut_findings_text(findings_lost)
    if cut is not None:
        return ((truncate(cut, width), "warn"),)
    return (("no findings: nothing costs the job a visible share of its time", "dim"),)


def advice_pane_lines(
    findings: Sequence[Finding], breakdowns: Sequence[Breakdown], width: int = 100, attached: bool = True,
    has_gpu: bool = True, pending: Sequence[Finding] = (), no_stacks: str | None = None,
    exited: str | None = None, collecting: Evidence | None = None, session_start: float | None = None,
    findings_lost: str | None = None,
) -> list[Line]:
    """``exited``: the attached job has ended ("PID N at HH:MM:SS"): said first, and the findings
    read as what was showing while it ran. ``collecting``: the advisor has not yet had enough
    evidence for a verdict (``Verdict.collecting``): said instead of "no findings".
    ``session_start``: when the session's polls began (``session_start_in``): a window reaching
    before it says how much. ``findings_lost``: as for ``verdict_line``."""
    out: list[Line] = []
    if exited is not None:
        end = ("the findings below are from while it ran." if findings
               else "no finding was showing when it ended; nothing more is sampled.")
        out.extend(_wrapped(f"The attached job exited ({exited}): {end}", width, "", "", "warn"))
        out.append(())
    shown = [b for b in breakdowns if b.total_s > 0]
    for bd in shown:
        out.extend(breakdown_lines(bd, width, session_start))
        out.append(())
    if not shown and not has_gpu and no_stacks:
        out.extend(_wrapped(f"No GPU here and the job's stacks cannot be read ({no_stacks}): there is no device "
                            "time to break down. GPU and host monitoring go on.", width, "", "", "dim"))
        out.append(())
    elif not shown and not attached and not has_gpu:
        # Nothing will ever be broken down: say what would change that instead of "collecting".
        out.extend(_wrapped("No GPU here and no job attached: there is no device time to break down. Attach to "
                            "a training process (Enter on its row in Processes, or gputop --pid PID) to see "
                            "where its time goes.", width, "", "", "dim"))
        out.append(())
    elif not shown:
        out.append((("Collecting: the time breakdown appears after the first seconds of samples.", "dim"),))
        out.append(())
    if not findings and exited is not None:
        return out
    if not findings and pending:
        # The advisor sees a cause but names it only once it has held: say so, rather than
        # "no findings" under a bar that shows the cost.
        names = "; ".join(f.title for f in pending[:3])
        out.extend(_wrapped(f"Confirming: {names}. A cause is named once it has held for a few seconds.",
                            width, "", "", "dim"))
        return out
    wait = collecting_text(collecting, stacks_readable=no_stacks is None)
    if not findings and wait is not None:
        out.extend(_wrapped(wait, width, "", "", "dim"))
        return out
    unknown = max((bd.get(Bucket.UNKNOWN) / bd.total_s for bd in shown), default=0.0)
    if not findings and unknown >= UNEXPLAINED_SHARE:
        # The bar above shows time no cause was found for: "nothing costs the job" would deny it.
        out.extend(_wrapped(f"No finding names a cause, but {unknown:.0%} of the time is other/unknown: no rule "
                            "knows what the job does then. The Stacks tab (3) shows where its main thread is.",
                            width, "", "", "dim"))
        return out
    named = unnamed_wait(shown)
    if not findings and named:
        out.extend(_wrapped(named, width, "", "", "dim"))
        return out
    cut = cut_findings_text(findings_lost)
    if not findings and cut is not None:
        out.extend(_wrapped(f"{cut[0].upper()}{cut[1:]}. This replay judges again the samples that survived; what "
                            "the cut took, it cannot.", width, "", "", "warn"))
        return out
    if not findings:
        msg = "No findings: nothing costs the job a visible share of its time."
        if not attached:
            msg += " Attach to the training process (--pid) to see why a GPU waits."
        out.append(((msg, "dim"),))
        return out
    for i, f in enumerate(findings, 1):
        meta = f"{f.severity.value} · confidence {f.confidence:.0%}"
        if f.cost_s > 0:
            meta += f" · {cost_text(f)}"
        head = f"{SEVERITY_MARK.get(f.severity, '  ')}{i}. "
        title = _wrapped(f.title, width, head, f"sev.{f.severity.value}", "title")
        if len(_plain(title[-1])) + 2 + len(meta) <= width:
            title[-1] = (*title[-1], ("  " + meta, "dim"))
        else:  # the numbers go under the title rather than off the edge
            title += _wrapped(meta, width, " " * len(head), "", "dim")
        out.extend(title)
        for e in f.evidence:
            out.extend(_wrapped(e, width, "     - ", "dim", ""))
        out.extend(_wrapped(f.action, width, "     do: ", "num", "action"))
        if f.expected_gain:
            out.extend(_wrapped(f.expected_gain, width, "     gain: ", "dim", ""))
        out.append(())
    return out
