"""Findings and time breakdowns as text, bar segments and JSON. Pure: no Textual, no I/O.

The advise command prints these; the advisor pane draws the same segments and lines, so the
two never disagree.
"""

from __future__ import annotations

import textwrap
from typing import Iterable, Mapping, Sequence

from ..analysis.breakdown import BUCKET_LABELS, CPU_DEVICE, Breakdown, Bucket, whole_percentages
from ..model import Finding, Severity

SEVERITY_MARK = {Severity.CRITICAL: "!!", Severity.WARNING: "! ", Severity.INFO: "i "}
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
    return f"{device_name(bd)} over {bd.total_s:.0f} s: " + ", ".join(parts)


def breakdown_table(bds: Sequence[Breakdown]) -> str:
    """A table per device: bucket, seconds, percent (adding up to 100), and the bar."""
    lines: list[str] = []
    for bd in bds:
        if bd.total_s <= 0:
            continue
        note = "" if bd.attributed else "  (no stack samples: idle time not attributed)"
        lines.append(f"{device_name(bd)}: where the time went over the last {bd.total_s:.0f} s{note}")
        lines.append("  " + bar_text(bd, 50))
        for b, s, p in breakdown_rows(bd):
            lines.append(f"  {BUCKET_CHAR[b]} {BUCKET_LABELS[b]:<32} {s:7.1f} s  {p:3d} %")
    return "\n".join(lines)


def finding_lines(f: Finding, rank: int | None = None, width: int = 100, since: float | None = None) -> list[str]:
    """A finding as text: title line, then evidence, action and expected gain, wrapped."""
    head = f"{rank}. " if rank is not None else ""
    meta = f"[{f.severity.value}, confidence {f.confidence:.0%}"
    if f.cost_s > 0:
        meta += f", cost {f.cost_s:.1f} GPU-s"
    if since is not None and f.first_seen:
        meta += f", since +{f.first_seen - since:.0f} s"
    meta += "]"
    out = [f"{SEVERITY_MARK.get(f.severity, '  ')}{head}{f.title}  {meta}"]
    ind = " " * (len(head) + 4)
    for e in f.evidence:
        out.extend(textwrap.wrap(e, width, initial_indent=ind + "- ", subsequent_indent=ind + "  "))
    out.extend(textwrap.wrap(f.action, width, initial_indent=ind + "do: ", subsequent_indent=ind + "    "))
    if f.expected_gain:
        out.extend(textwrap.wrap(f.expected_gain, width, initial_indent=ind + "gain: ", subsequent_indent=ind + "      "))
    return out


def findings_text(findings: Sequence[Finding], width: int = 100, since: float | None = None) -> str:
    if not findings:
        return "No findings: nothing in this window costs the job a visible share of its time."
    blocks = ["\n".join(finding_lines(f, i + 1, width, since)) for i, f in enumerate(findings)]
    return "\n\n".join(blocks)


def finding_dict(f: Finding, since: float | None = None) -> dict:
    d = {
        "id": f.id,
        "title": f.title,
        "severity": f.severity.value,
        "confidence": f.confidence,
        "cost_s": f.cost_s,
        "gpu_index": f.gpu_index,
        "evidence": list(f.evidence),
        "action": f.action,
        "expected_gain": f.expected_gain,
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


def breakdown_lines(bd: Breakdown, width: int) -> list[Line]:
    """The bar (coloured per bucket) and a legend with percentages that add up to 100."""
    bar_w = max(10, width - 24)
    head: Line = (
        (f"{device_name(bd)} ", "title"),
        (f"last {bd.total_s:.0f} s", "dim"),
        ("" if bd.attributed else "  idle not attributed (no stacks)", "dim"),
    )
    bar: Line = tuple((BUCKET_CHAR[b] * n, f"bucket.{b.value}") for b, n in bar_segments(bd, bar_w))
    legend: list[Segment] = []
    for b, _, p in breakdown_rows(bd):
        legend.append((f"{BUCKET_CHAR[b]} ", f"bucket.{b.value}"))
        legend.append((f"{BUCKET_LABELS[b]} ", ""))
        legend.append((f"{p} %", "num"))
        legend.append(("   ", ""))
    return [head, bar, tuple(legend)]


def pane_lines(
    findings: Sequence[Finding], breakdowns: Sequence[Breakdown], width: int = 100, attached: bool = True
) -> list[Line]:
    out: list[Line] = []
    shown = [b for b in breakdowns if b.total_s > 0]
    for bd in shown:
        out.extend(breakdown_lines(bd, width))
        out.append(())
    if not shown:
        out.append((("Collecting: the time breakdown appears after the first seconds of samples.", "dim"),))
        out.append(())
    if not findings:
        msg = "No findings: nothing costs the job a visible share of its time."
        if not attached:
            msg += " Attach to the training process (--pid) to see why a GPU waits."
        out.append(((msg, "dim"),))
        return out
    wrap = max(30, width - 8)
    for i, f in enumerate(findings, 1):
        meta = f"  {f.severity.value} · confidence {f.confidence:.0%}"
        if f.cost_s > 0:
            meta += f" · cost {f.cost_s:.1f} GPU-s"
        out.append(((f"{SEVERITY_MARK.get(f.severity, '  ')}{i}. ", f"sev.{f.severity.value}"), (f.title, "title"), (meta, "dim")))
        for e in f.evidence:
            for j, chunk in enumerate(textwrap.wrap(e, wrap)):
                out.append((("     - " if j == 0 else "       ", "dim"), (chunk, "")))
        for j, chunk in enumerate(textwrap.wrap(f.action, wrap)):
            out.append((("     do: " if j == 0 else "         ", "num"), (chunk, "action")))
        if f.expected_gain:
            for j, chunk in enumerate(textwrap.wrap(f.expected_gain, wrap)):
                out.append((("     gain: " if j == 0 else "           ", "dim"), (chunk, "")))
        out.append(())
    return out
