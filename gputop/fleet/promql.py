"""The PromQL the job view sends: every series of one job in one query, and the jobs in sight.

One selector over the metric names (``{__name__=~"gputop_rank_.*", job_id="..."}``) brings every
rank series of a job in a single instant query, so a refresh is one round trip whatever the
number of ranks; the exporter bounds each rank to a few series (export.job_collector).
"""

from __future__ import annotations

RANK_METRICS = "gputop_rank_.*"
INFO_METRIC = "gputop_rank_info"


def quote(value: str) -> str:
    """A PromQL string literal: backslashes and double quotes escaped, newlines written out."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def job_query(job: str) -> str:
    return f'{{__name__=~{quote(RANK_METRICS)},job_id={quote(job)}}}'


def jobs_query() -> str:
    """Each rank's info and stuck series, of every job: the job list counts ranks, hosts and stuck ranks."""
    return f"{{__name__=~{quote(INFO_METRIC + '|gputop_rank_stuck')}}}"
