"""The PromQL the job view sends: every series of one job in one query, and the jobs in sight.

One selector over the metric names (``{__name__=~"gputop_rank_.*", job_id="..."}``) brings every
rank series of a job in a single instant query, so a refresh is one round trip whatever the
number of ranks; the exporter bounds each rank to a few series (export.job_collector).

The view judges a job over a past window, not one instant (``fleet.memory``): the same selector
as a subquery, ``{...}[60s:5s]``, answers with the series evaluated every 5 s over the last 60 s.
Prometheus aligns a subquery's steps to multiples of the step, so two queries a moment apart
evaluate the same instants (and Prometheus's staleness and look-back apply at each, exactly as
at an instant query), and it is still one round trip.
"""

from __future__ import annotations

RANK_METRICS = "gputop_rank_.*"
INFO_METRIC = "gputop_rank_info"


def quote(value: str) -> str:
    """A PromQL string literal: backslashes and double quotes escaped, newlines written out."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def job_query(job: str) -> str:
    return f'{{__name__=~{quote(RANK_METRICS)},job_id={quote(job)}}}'


def _seconds(s: float) -> str:
    return f"{max(1, round(s))}s"


def job_range_query(job: str, window_s: float, step_s: float) -> str:
    """Every rank series of ``job`` evaluated every ``step_s`` over the last ``window_s`` (whole
    seconds: PromQL durations are integers of a unit)."""
    return f"{job_query(job)}[{_seconds(window_s)}:{_seconds(step_s)}]"


def jobs_query() -> str:
    """Each rank's info and stuck series, of every job: the job list counts ranks, hosts and stuck ranks."""
    return f"{{__name__=~{quote(INFO_METRIC + '|gputop_rank_stuck')}}}"
