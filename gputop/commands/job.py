"""`gputop job --prometheus URL [JOB]`: one distributed job across its hosts, from the series each
host's `gputop export --attach all` publishes, read back through Prometheus's query API.

Without JOB it lists the jobs in sight and exits. A bad URL, an unreachable server or an unknown
job is one line and a non-zero exit, before any UI starts.
"""

from __future__ import annotations

import argparse

from .options import interval_arg

DEFAULT_INTERVAL_S = 5.0  # a 15 s scrape changes the series no faster; 5 s shows a change soon after


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "job",
        help="one distributed job across its hosts, from Prometheus (the straggler, the rank that never arrives)",
        description="Read the per-rank series that `gputop export --attach all` publishes on each host "
        "from a Prometheus server, and show one job: its ranks grouped by host, each rank's phases, hot "
        "line and top finding, the straggler the others wait for and what it costs them, a rank that "
        "never arrives. Without JOB, list the jobs the server holds.",
    )
    p.add_argument("job", nargs="?", metavar="JOB", help="the job's job_id label (omit to list the jobs)")
    p.add_argument("--prometheus", required=True, metavar="URL", help="the Prometheus server, e.g. http://prometheus:9090")
    p.add_argument("-i", "--interval", type=interval_arg, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help=f"refresh interval (default {DEFAULT_INTERVAL_S:g} s)")
    p.add_argument("--once", action="store_true", help="print the view once as text and exit (scripts, CI)")
    p.set_defaults(func=run)


def fetch_job(url: str, job: str):
    """The job and its judgement, now; UserError when the server fails or holds no such job."""
    from ..errors import UserError
    from ..fleet import build_job, job_query, judge

    found = build_job(job, _vector(url, job_query(job)))
    if not found.ranks:
        names = [s.job for s in fetch_jobs(url)]
        seen = f"; jobs in sight: {', '.join(names[:5])}{' …' if len(names) > 5 else ''}" if names else \
            "; it holds no gputop_rank_info series (exporters need --attach all)"
        raise UserError(f"no job {job!r} at {_shown(url)}{seen}", exit_code=1)
    return found, judge(found)


def fetch_jobs(url: str):
    from ..fleet import job_summaries, jobs_query

    return job_summaries(_vector(url, jobs_query()))


def _vector(url: str, promql: str):
    from ..errors import UserError
    from ..fleet import ApiError, parse_vector
    from ..sources import PrometheusError, prometheus_query

    try:
        return parse_vector(prometheus_query(url, promql))
    except (PrometheusError, ApiError) as exc:
        raise UserError(str(exc), exit_code=1) from None


def _shown(url: str) -> str:
    from ..sources import prometheus_shown

    return prometheus_shown(url.rstrip("/"))


def run(args: argparse.Namespace) -> int:
    import time

    from ..present import job_lines, job_plain, jobs_lines
    from ..units import fmt_clock

    if args.job is None:
        print(job_plain(jobs_lines(fetch_jobs(args.prometheus), _shown(args.prometheus))))
        return 0
    first = fetch_job(args.prometheus, args.job)  # fails here, in one line, before any UI
    if args.once:
        job, judgement = first
        print(job_plain(job_lines(job, judgement, 100, f"as of {fmt_clock(time.time())}", args.interval)))
        return 0
    from .options import require_terminal
    from ..ui.job_app import JobApp

    require_terminal()
    JobApp(lambda: fetch_job(args.prometheus, args.job), args.interval, first=first).run()
    return 0
