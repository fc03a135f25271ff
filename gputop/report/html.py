"""The report as one self-contained HTML page: inline CSS and SVG, no scripts, no links out.

Everything from the recording is escaped; the page can be mailed or attached to a ticket and
opens anywhere.
"""

from __future__ import annotations

from .. import __version__
from ..present import breakdown_rows, device_name
from ..analysis import BUCKET_LABELS, Bucket
from ..units import fmt_bytes, fmt_length, fmt_pct, fmt_time
from ..record import LOST_FINDINGS, backfill_note
from . import svg

# Idle bands by cause, the same causes the terminal's chart colours (present.idle_causes), in
# shades readable on a white page.
CAUSE_COLOURS: dict[Bucket, str] = {
    Bucket.DATA: "#f9a825",
    Bucket.CPU: "#ad1457",
    Bucket.SYNC: "#e53935",
    Bucket.H2D: "#1e88e5",
    Bucket.IO: "#ef6c00",
    Bucket.COLLECTIVE: "#8e24aa",
    Bucket.CHECKPOINT: "#546e7a",
    Bucket.UNKNOWN: "#9e9e9e",
}
_BUCKET_OF = {label: b for b, label in BUCKET_LABELS.items()}
from .memory import exit_gpu, exit_of, forecast_of, job_memory, memory_line, worker_trend, workers_line
from .ranks import rank_html
from .summary import (
    HELD_NO_GPU, MIN_IDLE_PERIOD_S, NOT_THE_JOBS, Summary, cost_text, coverage_note, finding_device, finding_when,
    gpus_text, in_session, judged_note, phase_text, session_cpu_line, session_line, several_targets,
)

BUCKET_COLORS = {
    Bucket.BUSY: "#2e7d32",
    Bucket.DATA: "#d32f2f",
    Bucket.CPU: "#ef6c00",
    Bucket.SYNC: "#ad1457",
    Bucket.H2D: "#6a1b9a",
    Bucket.IO: "#5d4037",
    Bucket.COLLECTIVE: "#f9a825",
    Bucket.CHECKPOINT: "#1565c0",
    Bucket.UNKNOWN: "#9e9e9e",
}

# The job's own memory beside the card's: a colour the page uses for nothing else.
JOB_MEMORY_COLOUR = "#c2185b"
# The workers' private memory (USS) summed, beside the main process's RSS.
WORKERS_USS_COLOUR = "#00838f"
# Workers listed one by one in the page at most (report --json has them all).
MAX_WORKER_ROWS = 16

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 24px auto;
       max-width: 1040px; color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
.meta { color: #555; } .warn { background: #fff3e0; border-left: 4px solid #ef6c00; padding: 6px 10px; }
.big { display: flex; gap: 24px; flex-wrap: wrap; margin: 10px 0; }
.big div { background: #f5f5f5; border-radius: 6px; padding: 8px 14px; }
.big b { display: block; font-size: 22px; }
table { border-collapse: collapse; margin: 6px 0; } td, th { padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: 600; } .num { text-align: right; font-variant-numeric: tabular-nums; }
.sw { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.finding { border: 1px solid #e0e0e0; border-radius: 6px; padding: 8px 12px; margin: 10px 0; }
.sev { font-weight: 700; text-transform: uppercase; font-size: 12px; padding: 1px 6px; border-radius: 3px; color: #fff; }
.sev.critical { background: #b71c1c; } .sev.warning { background: #f9a825; color: #222; } .sev.info { background: #0277bd; }
code { background: #f5f5f5; padding: 1px 4px; border-radius: 3px; }
.small { color: #666; font-size: 12px; }
"""


def _breakdown_table(bd, e) -> list[str]:
    rows = breakdown_rows(bd)
    out = [svg.stacked_bar([(BUCKET_LABELS[b], sec / bd.total_s, BUCKET_COLORS[b]) for b, sec, _ in rows],
                           title="time breakdown")]
    out.append("<table><tr><th>activity</th><th class=\"num\">share</th><th class=\"num\">time</th>"
               "<th>main thread was in</th></tr>")
    for b, sec, _p in sorted(rows, key=lambda r: -r[1]):
        labels = ", ".join(f"{lab} ({100 * f:.0f}%)" for lab, f in bd.top_labels(b, 2) if f >= 0.01)
        out.append(f"<tr><td><span class=\"sw\" style=\"background:{BUCKET_COLORS[b]}\"></span>"
                   f"{e(BUCKET_LABELS[b])}</td><td class=\"num\">{100 * sec / bd.total_s:.1f}%</td>"
                   f"<td class=\"num\">{e(fmt_length(sec))}</td><td>{e(labels)}</td></tr>")
    out.append("</table>")
    return out


def _cpu_device_html(s: Summary) -> list[str]:
    """The job used no GPU: its main thread's time line, as advise shows the CPU device."""
    e = svg.esc
    c = s.cpu
    bd = c.breakdown
    whose = "each session's target's main thread stands" if several_targets(s) else "the job's main thread stands"
    out = [f"<h2>{e(device_name(bd))}: where the time went</h2>",
           f"<p class=\"small\">{e(c.why)}: {whose} in for the device "
           f"({c.samples} stack samples over {e(fmt_length(bd.total_s))}).</p>"]
    note = coverage_note(s)
    if note:
        out.append(f"<p class=\"small\"><b>Not the whole recording:</b> {e(note)}.</p>")
    out += _breakdown_table(bd, e)
    if several_targets(s):
        out.append("<p class=\"small\">By session (each followed its own process):</p><ul>"
                   + "".join(f"<li>{e(session_cpu_line(x))}</li>" for x in s.sessions) + "</ul>")
    return out


def _told_html(fs, lead: str, e, evidence_only: bool = False) -> list[str]:
    """A recorded memory finding beside the memory chart: what the person was told, when, and
    the readings it rested on. ``evidence_only``: the exit's title only says "Job ended"."""
    if fs is None:
        return []
    f = fs.finding
    head = f.evidence[0] if evidence_only and f.evidence else f.title
    rest = f.evidence[1:2] if evidence_only else f.evidence[:2]
    return [f"<p class=\"warn\"><b>{e(lead)}</b> ({e(fmt_time(fs.first_seen))}): {e(head)}"
            + ("<br><span class=\"small\">" + "; ".join(e(x) for x in rest) + "</span>" if rest else "")
            + "</p>"]


def _workers_html(s: Summary, e) -> list[str]:
    """The DataLoader workers' private memory over the run: their USS summed (on its own scale: the
    main process's RSS, often ten times more, would flatten it; the judgement says whether that
    grew), the judgement, and each worker's figures."""
    w = s.workers_memory
    if w is None:
        return []
    out = ["<h3>DataLoader workers' private memory</h3>"]
    series = [("workers' USS (sum)", w.chart, WORKERS_USS_COLOUR)]
    out.append(svg.line_chart(s.start, s.end, series, unit="B", title="workers' private memory",
                              max_gap=s.chart_max_gap))
    out.append(f"<p>Private memory (USS, read every 12 s a worker): {e(workers_line(w))}.</p>")
    out.append("<table><tr><th>worker</th><th class=\"num\">first</th><th class=\"num\">last</th>"
               "<th class=\"num\">peak</th><th>trend</th></tr>")
    for x in w.workers[:MAX_WORKER_ROWS]:
        out.append(f"<tr><td>PID {x.pid}</td><td class=\"num\">{e(fmt_bytes(x.first))}</td>"
                   f"<td class=\"num\">{e(fmt_bytes(x.last))}</td><td class=\"num\">{e(fmt_bytes(x.peak))}</td>"
                   f"<td>{e(worker_trend(x))}</td></tr>")
    out.append("</table>")
    if len(w.workers) > MAX_WORKER_ROWS:
        out.append(f"<p class=\"small\">… and {len(w.workers) - MAX_WORKER_ROWS} more (report --json lists them all).</p>")
    return out


def render_html(s: Summary) -> str:
    e = svg.esc
    out: list[str] = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>gputop report: {e(s.host)} {e(fmt_time(s.start))}</title><style>{CSS}</style></head><body>",
        # A run without a GPU is no GPU run: the heading says what the report is of.
        f"<h1>{'GPU' if s.gpus else 'CPU'} run report: {e(s.host)}</h1>",
        f"<div class=\"meta\">{e(gpus_text(s))}"
        + (f" · driver {e(s.system.driver_version)}" if s.system and s.system.driver_version else "")
        + f" · {e(fmt_time(s.start))} → {e(fmt_time(s.end))} ({e(fmt_length(s.duration))})"
        + (f" · {e(backfill_note(s.backfill_s))}" if backfill_note(s.backfill_s) else "")
        + (" · <b>synthetic / fake data</b>" if s.source == "fake" else "")
        + "</div>",
    ]
    if (s.target_pid or s.target_cmdline) and not several_targets(s):
        rank = next((r.rank for r in s.ranks if r.pid == s.target_pid), None)
        which = f" (rank {rank} of {len(s.ranks)})" if rank is not None and len(s.ranks) > 1 else ""
        out.append(f"<div class=\"meta\">target PID {e(s.target_pid or '?')}{e(which)}: "
                   f"<code>{e(s.target_cmdline or '')}</code></div>")
    if len(s.sessions) > 1:
        more = f", {len(s.targets)} targets" if several_targets(s) else ""
        out.append(f"<div class=\"meta\">sessions: {len(s.sessions)} (appended){e(more)}<ul>"
                   + "".join(f"<li>{e(session_line(x, fmt_time))}</li>" for x in s.sessions) + "</ul></div>")
    for ph in s.phases:
        out.append(f"<div class=\"meta\">phase: {e(phase_text(ph, fmt_time, s.end) + in_session(s, ph.first_seen))}</div>")
    if s.damage:
        out.append(f"<p class=\"warn\">{e(s.damage)}</p>")
    marks = [(fs.first_seen, fs.finding.severity.value, fs.finding.title) for fs in s.findings]
    for g in s.gpus:
        bd = g.breakdown
        out.append(f"<h2>GPU {g.index}: {e(g.name)}</h2>")
        out.append("<div class=\"big\">")
        out.append(f"<div><b>{100 * g.busy_fraction:.1f}%</b>busy</div>")
        out.append(f"<div><b>{e(fmt_length(bd.idle_s))}</b>idle ({100 * (1 - g.busy_fraction):.1f}%)</div>")
        if g.job_used:
            out.append(f"<div><b>{g.idle_period_count}</b>idle periods ≥ {MIN_IDLE_PERIOD_S:.0f} s</div>")
        else:
            out.append("<div><b>not the job's</b>GPU</div>")
        if g.tensor_mean is not None:
            out.append(f"<div><b>{g.tensor_mean:.0f}%</b>tensor cores active</div>")
        if g.mem_max is not None:
            total = f" / {fmt_bytes(g.memory_total)}" if g.memory_total else ""
            out.append(f"<div><b>{e(fmt_bytes(g.mem_max))}</b>memory peak{e(total)}</div>")
        out.append("</div>")
        t0, t1 = s.start, s.end
        util = [(t, b.util) for t, b in g.chart]
        umin = [(t, b.util_min) for t, b in g.chart]
        idle = [(p.start, p.end, f"{p.cause} {fmt_length(p.duration)}" + (f" — {p.detail}" if p.detail else ""),
                 CAUSE_COLOURS.get(_BUCKET_OF.get(p.cause, Bucket.UNKNOWN), svg.COLORS["idle"]))
                for p in g.idle_periods]
        gmarks = [m for m, fs in zip(marks, s.findings) if fs.finding.gpu_index in (None, g.index)]
        gap = s.chart_max_gap
        out.append(svg.util_chart(t0, t1, util, umin, idle, gmarks, title=f"GPU {g.index} utilisation", max_gap=gap))
        causes = sorted({_BUCKET_OF.get(p.cause, Bucket.UNKNOWN) for p in g.idle_periods}, key=list(Bucket).index)
        legend = ", ".join(f'<span style="color:{CAUSE_COLOURS[b]}">&#9632;</span> {e(BUCKET_LABELS[b])}' for b in causes)
        out.append("<div class=\"small\">green: mean utilisation per interval; thin red line: its lowest "
                   "200 ms sample; bands: the longest idle periods, coloured by their cause"
                   + (f" ({legend})" if legend else "") + " (hover for the detail); triangles: findings.</div>")
        if bd.total_s > 0 and not g.job_used:
            # Its idle time is no cause of the job's: a breakdown here read as the job's stalls.
            out.append(f"<p class=\"small\">This GPU was {e(NOT_THE_JOBS)}.</p>")
        elif bd.total_s > 0:
            out.append("<h3>Where the time went</h3>")
            out += _breakdown_table(bd, e)
            if not bd.attributed and s.stacks_lost:
                out.append("<p class=\"small\">The stack samples were lost in the cut: idle time is not "
                           "attributed to a cause.</p>")
            elif not bd.attributed and s.cpu is not None and s.cpu.why == HELD_NO_GPU:
                out.append("<p class=\"small\">The job held none of the GPUs: their idle time is another "
                           "process's, not attributed to the job's stacks.</p>")
            elif not bd.attributed:
                out.append("<p class=\"small\">No stack samples were recorded (no --pid): idle time is not "
                           "attributed to a cause.</p>")
        if g.idle_periods:
            out.append("<h3>Longest idle periods</h3><table><tr><th>start</th><th class=\"num\">length</th>"
                       "<th>likely cause</th><th>main thread</th></tr>")
            for p in g.idle_periods:
                out.append(f"<tr><td>{e(fmt_time(p.start))}</td><td class=\"num\">{e(fmt_length(p.duration))}</td>"
                           f"<td>{e(p.cause)}</td><td><code>{e(p.detail)}</code></td></tr>")
            out.append("</table>")
        series = [("memory used (card)", [(t, b.mem_max) for t, b in g.chart], "line")]
        job = job_memory(g)
        if any(v is not None for _, v in job):
            series.append(("the job's memory", job, JOB_MEMORY_COLOUR))
        out.append("<h3>Memory and power</h3>")
        out.append(svg.line_chart(t0, t1, series, hi=g.memory_total or None, unit="B", title="GPU memory",
                                  max_gap=gap))
        line = memory_line(g)
        if line:
            out.append(f"<div class=\"small\">Memory: {e(line)}.</div>")
        out += _told_html(forecast_of(s, g.index), "Forecast shown live", e)
        ended = exit_of(s)
        if ended is not None and exit_gpu(ended) == g.index:
            out += _told_html(ended, "How the job ended", e, evidence_only=True)
        power = [("power (W)", [(t, b.power) for t, b in g.chart], "line2")]
        if any(v is not None for _, v in power[0][1]):
            out.append(svg.line_chart(t0, t1, power, hi=g.power_limit_w or None, unit="W", title="GPU power",
                                      max_gap=gap))
    if s.cpu is not None:
        out += _cpu_device_html(s)
    out.append("<h2>Host</h2>")
    out.append(f"<p>CPU mean {fmt_pct(s.host_cpu_mean)} (max {fmt_pct(s.host_cpu_max)})"
               + (f" of {s.host_cores} cores" if s.host_cores else "")
               + f", iowait {fmt_pct(s.host_iowait_mean, digits=1)}"
               + (f", memory peak {e(fmt_bytes(s.host_mem_max))} / {e(fmt_bytes(s.host_mem_total))}"
                  if s.host_mem_max else "") + "</p>")
    out.append(svg.line_chart(
        s.start, s.end,
        [("CPU %", [(t, b.cpu) for t, b in s.host_chart], "line"),
         ("iowait %", [(t, b.iowait) for t, b in s.host_chart], "idle")],
        hi=100.0, unit="%", title="host CPU", max_gap=s.chart_max_gap))
    mem = [(t, None if b.mem_max is None else b.mem_max / 2**30) for t, b in s.host_chart]
    if any(v is not None for _, v in mem):
        out.append(svg.line_chart(
            s.start, s.end, [("used GiB", mem, "line")],
            hi=s.host_mem_total / 2**30 if s.host_mem_total else None, unit=" GiB", title="host memory",
            max_gap=s.chart_max_gap))
    out += _workers_html(s, e)
    out += _told_html(forecast_of(s, None), "Forecast shown live", e)
    ended = exit_of(s)
    if ended is not None and exit_gpu(ended) is None:
        out += _told_html(ended, "How the job ended", e, evidence_only=True)
    out += rank_html(s.ranks, e)
    note = judged_note(s)
    out.append(f"<h2>Findings ({len(s.findings)})</h2>" if s.findings or not s.findings_lost or note else "<h2>Findings</h2>")
    if note:
        out.append(f"<p>Findings {e(note)}.</p>")
        if not s.findings:
            out.append("<p class=\"warn\">None the surviving samples can show: the stack samples were lost in the cut, "
                       "so the causes they would name cannot be judged.</p>" if s.stacks_lost else "<p>None.</p>")
    elif s.findings_lost:
        # LOST_FINDINGS is fixed text: nothing to escape.
        out.append("<p class=\"warn\">" + ("More findings may have been lost in the cut." if s.findings else
                                          f"Findings: {LOST_FINDINGS}.") + "</p>")
    elif not s.findings:
        out.append("<p>None recorded.</p>")
    for fs in s.findings:
        f = fs.finding
        sev = f.severity.value
        dev = finding_device(f)
        gpu = f" · {dev}" if dev else ""
        out.append(f"<div class=\"finding\"><span class=\"sev {e(sev)}\">{e(sev)}</span> <b>{e(f.title)}</b>"
                   f"<div class=\"small\">{e(finding_when(fs, fmt_time, s.end) + in_session(s, fs.first_seen))}{e(gpu)}"
                   f" · confidence {100 * f.confidence:.0f}%"
                   + (f" · {e(cost_text(fs, s))}" if fs.max_cost_s else "") + "</div>")
        if f.evidence:
            out.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in f.evidence) + "</ul>")
        if f.action:
            out.append(f"<div>Change: <code>{e(f.action)}</code></div>")
        if f.expected_gain:
            out.append(f"<div class=\"small\">Expected: {e(f.expected_gain)}</div>")
        out.append("</div>")
    if s.events:
        out.append(f"<h2>Warnings and errors ({len(s.events)})</h2><table>")
        for ev in s.events:
            out.append(f"<tr><td>{e(fmt_time(ev.ts))}</td><td>{e(ev.level)}</td><td>{e(ev.source)}</td>"
                       f"<td>{e(ev.message)}</td></tr>")
        out.append("</table>")
    out.append(f"<p class=\"small\">gputop {e(__version__)} · {e(s.path)} ({e(fmt_bytes(s.size_bytes))})</p>")
    out.append("</body></html>")
    return "\n".join(out)
