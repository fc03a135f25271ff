"""Reports over a recording: ``collect`` reads it into a ``Summary``; ``render_text`` and
``render_html`` present it (the HTML is one self-contained page with inline SVG charts)."""

from .collect import collect
from .html import render_html
from .summary import Summary
from .text import render_text

__all__ = ["Summary", "collect", "render_html", "render_text", "summary_dict"]


def summary_dict(s: Summary) -> dict:
    """The headline numbers as JSON-ready data (for scripts and dashboards)."""
    from ..analysis import BUCKET_LABELS
    from ..present import breakdown_dict, finding_dict, finding_gpu
    from .memory import workers_dict

    return {
        "path": s.path,
        "hostname": s.host,
        "start": s.start,
        "end": s.end,
        "duration_s": s.duration,
        # The last session's target; "sessions" has every session's (record --append adds one).
        "target_pid": s.target_pid,
        "target_cmdline": s.target_cmdline,
        "sessions": [
            {"session": x.index, "start": x.start, "end": x.end, "duration_s": round(x.duration, 1),
             "target_pid": x.target_pid, "target_cmdline": x.target_cmdline, "stack_samples": x.stack_samples,
             "cpu_device": None if x.cpu is None or s.cpu is None else breakdown_dict(x.cpu)}
            for x in s.sessions
        ],
        "damage": s.damage,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "busy_fraction": round(g.busy_fraction, 4),
                # false: NVML never listed the attached job (target, workers, ranks) on it; its
                # idle time is then measured, not attributed ("seconds": busy and other/unknown).
                "used_by_job": g.job_used,
                "measured_s": round(g.breakdown.total_s, 1),
                "seconds": {BUCKET_LABELS[b]: round(v, 1) for b, v in g.breakdown.seconds.items()},
                "idle_periods": [
                    {"start": p.start, "duration_s": round(p.duration, 1), "cause": p.cause, "detail": p.detail}
                    for p in g.idle_periods
                ],
                "memory_peak": g.mem_max,
                "power_mean_w": g.power_mean,
                "tensor_active_mean": g.tensor_mean,
            }
            for g in s.gpus
        ],
        # The job used no GPU: its main thread's time line, as advise --json's "breakdown" shows it.
        "cpu_device": _cpu_device(s),
        "host": {"cpu_mean": s.host_cpu_mean, "cpu_max": s.host_cpu_max, "iowait_mean": s.host_iowait_mean},
        # The attached job's DataLoader workers' private memory (USS), null where none was recorded.
        "workers_memory": workers_dict(s.workers_memory),
        # Whether the file keeps each finding's gain_predicted (advise --json's bound); when it
        # does not, every finding's gain_predicted below reads null: not recorded, not "no claim".
        "gain_predicted_recorded": s.gain_predicted_recorded,
        # A cut copy: the findings table was lost (whole or past the cut), so "findings" below is
        # what survived, not all there were; lost_tables names every table the cut took.
        "findings_lost": s.findings_lost,
        # The findings below were judged again from the samples by this gputop's advisor (the file's
        # were another version's, or lost in a cut): the step between evaluations, and the ids the
        # file's own findings held; null / [] when the findings are the file's.
        "judged_again_step_s": s.judged_step_s,
        "recorded_finding_ids": list(s.recorded_ids),
        "lost_tables": list(s.lost_tables),
        "findings": [
            {
                # advise --json's fields, same names and meaning (gain_predicted, cost_s, ...)...
                **finding_dict(fs.finding),
                # ...and the report's own over the whole recording.
                "id": fs.finding.id,
                "title": fs.finding.title,
                "severity": fs.finding.severity.value,
                "gpu": finding_gpu(fs.finding),
                "first_seen": fs.first_seen,
                "last_seen": fs.last_seen,  # the last time it was written (every 10 s while showing)
                # Still showing when the recording (its session) ended, else when it cleared
                # (null: the file does not say; last_seen is then the latest known).
                "until_end": fs.until_end,
                "cleared": fs.cleared,
                "shown_until": fs.shown_until,
                "evidence": list(fs.finding.evidence),
                "action": fs.finding.action,
                "expected_gain": fs.finding.expected_gain,
            }
            for fs in s.findings
        ],
        # The job's phases the advisor named (warming up), not findings: when each was.
        "phases": [
            {"id": ph.finding.id, "title": ph.finding.title, "first_seen": ph.first_seen,
             "until_end": ph.until_end, "cleared": ph.cleared, "shown_until": ph.shown_until}
            for ph in s.phases
        ],
        "ranks": [
            {"rank": r.rank, "pid": r.pid, "gpu": r.gpu, "samples": r.samples,
             "shares": {name: round(sh, 4) for name, sh in r.groups}, "collective": r.collective_fn,
             "hot": r.hot, "hot_share": round(r.hot_share, 4),
             # false: ``hot`` is where the rank's own code waits (in a collective), not its work
             "hot_own": r.hot_own}
            for r in s.ranks
        ],
    }


def _cpu_device(s: Summary) -> dict | None:
    from ..analysis import Bucket
    from ..present import breakdown_dict
    from .summary import coverage_note

    if s.cpu is None:
        return None
    bd = s.cpu.breakdown
    d = breakdown_dict(bd)
    d["why"] = s.cpu.why
    d["stack_samples"] = s.cpu.samples
    # What of the recording the breakdown covers ("covered_s" of "span_s"), and what it leaves out:
    # before the first main-thread sample, after the last, and spacings between samples the stack
    # time line takes for lost data (as advise does).
    c = s.cpu
    d["span_s"] = round(c.span_s, 1)
    d["covered_s"] = round(c.covered_s, 1)
    d["whole_recording"] = not c.partial
    d["left_out"] = {"before_first_sample_s": round(c.before_s, 1), "after_last_sample_s": round(c.after_s, 1),
                     "between_sessions_s": round(c.between_s, 1), "sessions_without_samples_s": round(c.unsampled_s, 1),
                     "gaps": c.gaps, "gaps_s": round(c.gap_s, 1),
                     "gap_min_s": round(c.gap_min_s, 2), "gap_max_s": round(c.gap_max_s, 2)}
    d["note"] = coverage_note(s) or None
    # What the main thread was in while not computing, per bucket id (share of those samples).
    d["top_labels"] = {b.value: [{"label": lab, "share": round(f, 4)} for lab, f in bd.top_labels(b, 2)]
                       for b in Bucket if bd.top_labels(b, 2)}
    return d
