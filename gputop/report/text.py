"""The report as plain text for a terminal: headline numbers, bars and sparklines first."""

from __future__ import annotations

import textwrap

from ..present import BUCKET_CHAR, bar_text, breakdown_rows, device_name
from ..analysis import BUCKET_LABELS, Bucket
from ..units import fmt_bytes, fmt_length, fmt_pct, fmt_time, sparkline
from ..record import LOST_FINDINGS, backfill_note
from .memory import (
    card_memory, exit_gpu, exit_of, forecast_of, job_memory, memory_line, worker_line, workers_line,
)
from .ranks import rank_text_lines
from .summary import (
    HELD_NO_GPU, MIN_IDLE_PERIOD_S, NOT_THE_JOBS, Summary, cost_text, coverage_note, finding_device, finding_when,
    gpus_text, in_session, judged_note, phase_text, session_cpu_line, session_line, several_targets,
)

SEVERITY_TAG = {"critical": "CRITICAL", "warning": "warning", "info": "info"}


# The chart's buckets can be shorter than the sample interval (a 1 s bucket, 2 s polls): an empty
# bucket between two full ones is a poll that fell elsewhere, not a gap in the data.
SHORT_GAP_BUCKETS = 2


def _hold_short_gaps(values: list[float | None]) -> list[float | None]:
    out = list(values)
    last = None
    for i, v in enumerate(values):
        if v is None:
            continue
        if last is not None and 0 < i - last - 1 <= SHORT_GAP_BUCKETS:
            for j in range(last + 1, i):
                out[j] = values[last]
        last = i
    return out


def _resample(values: list[float | None], width: int) -> list[float | None]:
    values = _hold_short_gaps(values)
    if len(values) <= width:
        return values
    out: list[float | None] = []
    for i in range(width):
        chunk = [v for v in values[i * len(values) // width : (i + 1) * len(values) // width] if v is not None]
        out.append(sum(chunk) / len(chunk) if chunk else None)
    return out


def cpu_device_lines(s: Summary, width: int = 100) -> list[str]:
    """The job's own time line when it used no GPU: the breakdown advise prints for the
    "CPU (no GPU)" device (``present.advice.breakdown_rows``), over the whole recording."""
    c = s.cpu
    if c is None:
        return []
    bd = c.breakdown
    whose = "each session's target's main thread" if several_targets(s) else "the job's main thread"
    out = ["", f"{device_name(bd)}: where the time went over {fmt_length(bd.total_s)} "
               f"({c.why}: {whose}, {c.samples} stack samples)"]
    note = coverage_note(s)
    if note:
        out += textwrap.wrap(note, width=max(60, width), initial_indent="  ", subsequent_indent="  ")
    out.append("  " + bar_text(bd, 50))
    for b, sec, p in breakdown_rows(bd):
        out.append(f"  {BUCKET_CHAR[b]} {BUCKET_LABELS[b]:<32} {fmt_length(sec):>9}  {p:3d} %")
        for label, frac in bd.top_labels(b, 2):
            if frac >= 0.01:
                out.append(f"      {label}  ({100 * frac:.0f}% of samples while not computing)")
    if several_targets(s):
        # Two processes in one breakdown: each session's own, so that neither is read as the other's.
        out.append("  by session (each followed its own process):")
        out += [f"    {session_cpu_line(x)}" for x in s.sessions]
    return out


def _told(fs, lead: str, width: int, evidence: bool = False) -> list[str]:
    """A recorded memory finding as the report's line: when it was shown, and its title (the
    forecast as the person read it), or with ``evidence`` its first piece of evidence instead
    (the exit's readings: its title only says "Job ended"). The findings section has the rest."""
    if fs is None:
        return []
    f = fs.finding
    said = f.evidence[0] if evidence and f.evidence else f.title
    body = f"{lead} ({fmt_time(fs.first_seen)}): {said}"
    return textwrap.wrap(body, width=width, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)


def _memory_lines(s: Summary, g, spark_w: int, width: int) -> list[str]:
    """The GPU's memory over the run: the job's own where it was recorded, else the card's, on
    the card's scale; then the live forecast and, where it ran out here, how the job ended."""
    series = job_memory(g)
    if all(v is None for _, v in series):
        series = card_memory(g)
    out = []
    line = memory_line(g)
    if line is not None:
        top = g.memory_total or max((v for _, v in series if v is not None), default=1.0)
        out.append(f"  memory       {sparkline(_resample([v for _, v in series], spark_w), hi=top)}")
        out.append(f"  memory: {line}")
    out += _told(forecast_of(s, g.index), "forecast shown live", width)
    ended = exit_of(s)
    if ended is not None and exit_gpu(ended) == g.index:
        out += _told(ended, "how the job ended", width, evidence=True)
    return out


# Workers listed one by one in the text report at most (the JSON and the HTML have them all).
MAX_WORKER_LINES = 8


def _workers_lines(s: Summary, spark_w: int, width: int) -> list[str]:
    """The DataLoader workers' private memory (USS) over the run: their sum as a sparkline (from
    zero to its peak), the sentence with the judgement, and each worker's figures."""
    w = s.workers_memory
    if w is None:
        return []
    out = [f"  {'USS':<11}{sparkline(_resample([v for _, v in w.chart], spark_w), hi=w.total_peak or 1.0)}"]
    out += textwrap.wrap(f"workers' private memory (USS): {workers_line(w)}", width=width, initial_indent="  ",
                         subsequent_indent="    ", break_on_hyphens=False)
    for x in w.workers[:MAX_WORKER_LINES]:
        out.append(f"    {worker_line(x)}")
    if len(w.workers) > MAX_WORKER_LINES:
        out.append(f"    … {len(w.workers) - MAX_WORKER_LINES} more (report --json lists them all)")
    return out


def render_text(s: Summary, width: int = 100) -> str:
    width = max(60, width)
    out: list[str] = []
    out.append(f"gputop report: {s.path}")
    fake = "  [synthetic/fake data]" if s.source == "fake" else ""
    drv = f"  driver {s.system.driver_version}" if s.system and s.system.driver_version else ""
    out.append(f"host {s.host}  {gpus_text(s)}{drv}{fake}")
    note = backfill_note(s.backfill_s)
    out.append(f"{fmt_time(s.start)} → {fmt_time(s.end)}  ({fmt_length(s.duration)})  file {fmt_bytes(s.size_bytes)}")
    if note:
        out.append(f"({note})")
    if (s.target_pid or s.target_cmdline) and not several_targets(s):
        # A multi-rank job watched from its launcher follows one rank: said, since the launcher's
        # PID is the one the user gave.
        rank = next((r.rank for r in s.ranks if r.pid == s.target_pid), None)
        which = f" (rank {rank} of {len(s.ranks)}: the ranks below)" if rank is not None and len(s.ranks) > 1 else ""
        out.append(f"target PID {s.target_pid or '?'}{which}  {s.target_cmdline or ''}".rstrip())
    if len(s.sessions) > 1:
        # Appended sessions: each one's span and target (the line above would name the last one's only).
        more = f", {len(s.targets)} targets" if several_targets(s) else ""
        out.append(f"sessions: {len(s.sessions)} (appended){more}")
        for x in s.sessions:
            out.extend(textwrap.wrap(session_line(x, fmt_time), width=width, initial_indent="  ",
                                     subsequent_indent="    ", break_on_hyphens=False))
    for ph in s.phases:
        out.extend(textwrap.wrap(f"phase: {phase_text(ph, fmt_time, s.end)}{in_session(s, ph.first_seen)}",
                                 width=width, subsequent_indent="       ",
                                 break_on_hyphens=False))
    if s.damage:
        out.append(f"WARNING: {s.damage}")
    spark_w = width - 14
    for g in s.gpus:
        bd = g.breakdown
        out.append("")
        out.append(f"GPU {g.index}  {g.name}")
        utils = _resample([b.util for _, b in g.chart], spark_w)
        out.append(f"  utilisation  {sparkline(utils)}")
        out += _memory_lines(s, g, spark_w, width)
        if bd.total_s > 0:
            out.append(f"  busy {100 * g.busy_fraction:.1f}%   idle {100 * (1 - g.busy_fraction):.1f}% "
                       f"({fmt_length(bd.idle_s)} of {fmt_length(bd.total_s)} measured)")
            rows = [(b, sec, p) for b, sec, p in breakdown_rows(bd) if b is not Bucket.BUSY]
            if not g.job_used:
                # Its idle time is no cause of the job's: a breakdown here read as the job's stalls.
                out.append(f"  {NOT_THE_JOBS}")
            elif rows:
                why = ("stack samples lost in the cut" if s.stacks_lost
                       else HELD_NO_GPU if s.cpu is not None and s.cpu.why == HELD_NO_GPU
                       else "no stack samples")
                out.append("  where the idle time went" + ("" if bd.attributed else f" ({why}: unattributed)") + ":")
                idle = max(1e-9, bd.idle_s)
                for b, sec, _p in sorted(rows, key=lambda r: -r[1]):
                    share = sec / bd.total_s
                    bar = BUCKET_CHAR[b] * max(1, round(40 * sec / idle))
                    out.append(f"    {BUCKET_LABELS[b]:<30} {100 * share:5.1f}%  {fmt_length(sec):>9}  {bar}")
                    for label, frac in bd.top_labels(b, 2):
                        if frac < 0.01:
                            continue
                        out.append(f"      {label}  ({100 * frac:.0f}% of idle samples)")
        if g.idle_periods:
            out.append(f"  idle periods of {MIN_IDLE_PERIOD_S:.0f} s or more: {g.idle_period_count}, {fmt_length(g.idle_period_s)} in total; longest:")
            for p in g.idle_periods[:5]:
                detail = f" — {p.detail}" if p.detail else ""
                out.append(f"    {fmt_time(p.start)}  {fmt_length(p.duration):>8}  {p.cause}{detail}")
        facts = []
        if g.mem_max is not None:
            total = f" / {fmt_bytes(g.memory_total)}" if g.memory_total else ""
            facts.append(f"memory peak {fmt_bytes(g.mem_max)}{total}")
        if g.power_mean is not None:
            lim = f" / {g.power_limit_w:.0f} W" if g.power_limit_w else ""
            facts.append(f"power mean {g.power_mean:.0f} W{lim}")
        if g.temp_max is not None:
            facts.append(f"max {g.temp_max:.0f}°C")
        if g.tensor_mean is not None:
            facts.append(f"tensor cores active {g.tensor_mean:.0f}%")
        if g.throttled_fraction:
            facts.append(f"clocks held back {100 * g.throttled_fraction:.0f}% of the time")
        if facts:
            out.append("  " + ", ".join(facts))
    if s.cpu is not None:
        out += cpu_device_lines(s, width)
    out.append("")
    cpu = [b.cpu for _, b in s.host_chart]
    out.append(f"host   CPU mean {fmt_pct(s.host_cpu_mean)} (max {fmt_pct(s.host_cpu_max)})"
               f"{f' of {s.host_cores} cores' if s.host_cores else ''}, iowait {fmt_pct(s.host_iowait_mean, digits=1)}"
               + (f", memory peak {fmt_bytes(s.host_mem_max)} / {fmt_bytes(s.host_mem_total)}" if s.host_mem_max else ""))
    out.append(f"  CPU        {sparkline(_resample(cpu, spark_w))}")
    mem = [b.mem_max for _, b in s.host_chart]
    if any(v is not None for v in mem):
        # On the host's scale: a leak on the host (a CPU job, the main process) shows as it grew.
        out.append(f"  memory     {sparkline(_resample(mem, spark_w), hi=s.host_mem_total or max(v for v in mem if v))}")
        seen = [v for v in mem if v is not None]
        total = f" of {fmt_bytes(s.host_mem_total)}" if s.host_mem_total else ""
        out.append(f"  memory: the host's used {fmt_bytes(seen[0])} → {fmt_bytes(seen[-1])} "
                   f"(peak {fmt_bytes(max(seen))}){total}")
    out += _workers_lines(s, spark_w, width)
    out += _told(forecast_of(s, None), "forecast shown live", width)
    ended = exit_of(s)
    if ended is not None and exit_gpu(ended) is None:
        out += _told(ended, "how the job ended", width, evidence=True)
    out.append("")
    if s.ranks:
        out += rank_text_lines(s.ranks) + [""]
    note = judged_note(s)
    if note:
        out.extend(textwrap.wrap(f"findings {note}", width=width, subsequent_indent="  ", break_on_hyphens=False))
    if s.findings:
        more = "; more may have been lost in the cut" if s.findings_lost and not note else ""
        out.append(f"findings ({len(s.findings)}{more})")
        def wrapped(lead: str, body: str) -> list[str]:
            # A hanging indent: continuation lines line up with the text after the lead ("→ ").
            pad = " " * (6 + len(lead))
            return textwrap.wrap(body, width=width, initial_indent=" " * 6 + lead, subsequent_indent=pad,
                                 break_on_hyphens=False)
        for fs in s.findings:
            f = fs.finding
            dev = finding_device(f)
            gpu = f" {dev}" if dev else ""
            out.append(f"  [{SEVERITY_TAG.get(f.severity.value, f.severity.value)}]{gpu} {f.title}")
            out.append(f"      {finding_when(fs, fmt_time, s.end)}{in_session(s, fs.first_seen)}"
                       + (f", {cost_text(fs, s)}" if fs.max_cost_s else "")
                       + f", confidence {100 * f.confidence:.0f}%")
            for e in f.evidence:
                out.extend(wrapped("· ", e))
            if f.action:
                out.extend(wrapped("→ ", f.action))
            if f.expected_gain:
                out.extend(wrapped("  expected: ", f.expected_gain))
    elif note and s.stacks_lost:
        # Judged again without the stack samples: most causes cannot show, so "none" would read as
        # a clean bill for a job whose recorded warning went with the cut (a new user's report).
        out.extend(textwrap.wrap("findings: none the surviving samples can show (the stack samples were lost in the "
                                 "cut: the causes they would name cannot be judged)", width=width,
                                 subsequent_indent="  "))
    elif note:
        out.append("findings: none")
    elif s.findings_lost:
        # The recorded verdicts are gone; a replay's Advisor judges the samples that survived
        # again, so it may show one: said here, so the two do not read as contradicting.
        out.append(f"findings: {LOST_FINDINGS}")
    else:
        out.append("findings: none recorded")
    if s.events:
        out.append("")
        out.append(f"warnings and errors ({len(s.events)})")
        for e in s.events[-15:]:
            # Wrapped under the message, never cut: the end of an error is often its remedy.
            lead = f"  {fmt_time(e.ts)}  {e.level:<7} "
            out.extend(textwrap.wrap(f"{e.source}: {e.message}", width=width, initial_indent=lead,
                                     subsequent_indent=" " * len(lead), break_on_hyphens=False))
    return "\n".join(out) + "\n"
