"""Read a recording into a ``Summary``, an hour at a time."""

from __future__ import annotations

from ..analysis.idle import poll_slices, util_slices
from ..model import GpuSample, UtilPoint
from ..record.reader import Reader
from .ranks import collect_ranks
from .summary import RunAccumulator, Summary, summarise_findings

# Work in chunks so a day-long recording never sits in memory at once.
CHUNK_S = 3600.0
# Events worth listing in a report.
EVENT_LEVELS = ("warning", "error")
MAX_EVENTS = 50


def collect(reader: Reader, chunk_s: float = CHUNK_S) -> Summary:
    start, end = reader.start_ts, reader.end_ts
    last = reader.sessions[-1] if reader.sessions else {}
    target = last.get("target_pid")
    acc = RunAccumulator(start, max(end, start + 1.0))
    # The first util point's period reaches back before the chunk: read a little earlier.
    t = start - 1e-6
    carry: dict[int, UtilPoint] = {}
    while t < end:
        e = min(end, t + chunk_s)
        pts: dict[int, list[UtilPoint]] = {}
        for p in reader.util_points(t, e):
            pts.setdefault(p.index, []).append(p)
        polls: dict[int, list[GpuSample]] = {}
        for s in reader.gpu_samples(t, e):
            polls.setdefault(s.index, []).append(s)
        slices = {}
        for g in set(pts) | set(polls):
            if g in pts:
                seq = ([carry[g]] if g in carry else []) + pts[g]
                slices[g] = util_slices(seq, t, e)
                carry[g] = pts[g][-1]
            else:
                slices[g] = poll_slices(polls[g], t, e)
        stacks = reader.stack_samples(t, e, main_only=True, pid=target)
        if not stacks and target is not None:
            stacks = reader.stack_samples(t, e, main_only=True)
        acc.add_chunk(slices, polls, stacks, reader.host_samples(t, e), reader.proc_samples(t, e))
        t = e
    events = [ev for ev in reader.events(float("-inf"), float("inf")) if ev.level in EVENT_LEVELS][-MAX_EVENTS:]
    sysinfo = reader.system_info()
    return acc.summary(
        path=str(reader.path),
        host=(sysinfo.hostname if sysinfo else None) or last.get("host") or "?",
        system=sysinfo,
        target_pid=target,
        target_cmdline=last.get("target_cmdline"),
        source=(sysinfo.source if sysinfo else None) or last.get("mode") or "live",
        findings=summarise_findings(reader.finding_rows()),
        events=events,
        damage=reader.damage,
        size_bytes=reader.size_bytes(),
        gpu_infos={g.index: g for g in reader.gpu_infos()},
        backfill_s=reader.span.backfill_s,
        ranks=collect_ranks(reader, chunk_s),
        sample_interval=max((x["interval"] or 0.0 for x in reader.sessions), default=0.0) or None,
    )
