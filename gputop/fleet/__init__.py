"""A job across hosts, as Prometheus holds what each host's exporter said of its ranks: the
queries, the API's answers parsed, the job model, the judgement across ranks (the straggler,
the rank that never arrives) and its memory across evaluations (the hold rule). Pure: no
network, no Textual; the client is
``sources.prometheus_api`` and the view ``ui.job_app``. This is its face."""

from __future__ import annotations

from .api import ApiError, Series, parse_matrix, parse_vector
from .hold import LOOK_BACK_S, Held, HoldRule, Key
from .judge import Judgement, NeverArrives, Straggler, judge, key, starting_of
from .memory import Memory, judged
from .model import PHASES, Job, JobSummary, RankState, build_job, build_jobs, job_summaries
from .promql import job_query, job_range_query, jobs_query, quote

__all__ = [
    "ApiError", "Held", "HoldRule", "Job", "JobSummary", "Judgement", "Key", "LOOK_BACK_S", "Memory", "NeverArrives",
    "PHASES", "RankState", "Series", "Straggler", "build_job", "build_jobs", "job_query", "job_range_query",
    "job_summaries", "jobs_query", "judge", "judged", "key", "parse_matrix", "parse_vector", "quote", "starting_of",
]
