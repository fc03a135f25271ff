"""`gputop job --prometheus URL [JOB]`: one distributed job across its hosts, from the series each
host's `gputop export --attach all` publishes, read back through Prometheus's query API.

Without JOB it lists the jobs in sight and exits. A bad URL or an unknown job is one line and exit
status 2 (bad input, as for every command); a server that cannot be reached or fails, one line and
exit status 1; both before any UI starts.

The verdict is never one instant's: the view reads the job's series evaluated every refresh
interval over the last minute (one subquery) and applies the hold rule (``fleet.hold``) to them,
so `--once` says what the live view would say after watching that minute, and the live view
starts from that minute and then adds each refresh's evaluations to the same memory.
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


def fetch_steps(url: str, job: str, window_s: float, step_s: float):
    """The job at each evaluation of the last ``window_s`` (oldest first); UserError when the
    server fails or holds no such job."""
    from ..errors import UserError
    from ..fleet import ApiError, build_jobs, job_range_query, parse_matrix

    try:
        steps = build_jobs(job, parse_matrix(_answer(url, job_range_query(job, window_s, step_s))))
    except ApiError as exc:
        raise UserError(str(exc), exit_code=1) from None
    if not steps:
        names = [s.job for s in fetch_jobs(url)]
        seen = f"; jobs in sight: {', '.join(names[:5])}{' …' if len(names) > 5 else ''}" if names else \
            "; it holds no gputop_rank_info series (exporters need --attach all)"
        # A name that is not there is bad input, as `replay` of a file that is not there.
        raise UserError(f"no job {job!r} at {_shown(url)}{seen}")
    return steps


def fetch_job(url: str, job: str, step_s: float = DEFAULT_INTERVAL_S):
    """The job now and what the view shows of it: the last minute's evaluations through the
    hold rule (what `--once` prints)."""
    from ..fleet import LOOK_BACK_S, judged

    return judged(fetch_steps(url, job, LOOK_BACK_S, step_s), step_s=step_s)


class JobWatch:
    """The live view's refresh: the first reads the last minute, each later one the few newest
    evaluations (a range that overlaps the last one; what was fed already is skipped), all into
    one memory, so a finding is held across refreshes by the same rule as `--once`'s."""

    def __init__(self, url: str, job: str, step_s: float) -> None:
        from ..fleet import Memory

        self.url, self.job, self.step_s = url, job, step_s
        self.memory = Memory(step_s=step_s)

    def __call__(self):
        from ..fleet import LOOK_BACK_S

        # Three steps back: a refresh that comes late (a slow answer, a busy machine) still
        # gets every evaluation since the last one.
        window = LOOK_BACK_S if self.memory.at is None else 3 * self.step_s
        self.memory.feed_all(fetch_steps(self.url, self.job, window, self.step_s))
        return self.memory.job, self.memory.judgement()


def fetch_jobs(url: str):
    from ..fleet import job_summaries, jobs_query

    return job_summaries(_vector(url, jobs_query()))


def _answer(url: str, promql: str) -> object:
    from ..errors import UserError
    from ..sources import BadPrometheusUrl, PrometheusError, prometheus_query

    try:
        return prometheus_query(url, promql)
    except BadPrometheusUrl as exc:
        raise UserError(str(exc)) from None  # the URL given: bad input (exit 2)
    except PrometheusError as exc:
        raise UserError(str(exc), exit_code=1) from None


def _vector(url: str, promql: str):
    from ..errors import UserError
    from ..fleet import ApiError, parse_vector

    try:
        return parse_vector(_answer(url, promql))
    except ApiError as exc:
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
    if args.once:
        job, judgement = fetch_job(args.prometheus, args.job, args.interval)  # fails in one line
        at = judgement.at if judgement.at is not None else time.time()
        print(job_plain(job_lines(job, judgement, 100, f"as of {fmt_clock(at)}", args.interval)))
        return 0
    from .options import require_terminal
    from ..ui.job_app import JobApp

    watch = JobWatch(args.prometheus, args.job, args.interval)
    first = watch()  # fails here, in one line, before any UI
    require_terminal()
    JobApp(watch, args.interval, first=first).run()
    return 0
