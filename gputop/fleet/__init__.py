"""A job across hosts, as Prometheus holds what each host's exporter said of its ranks: the
queries, the API's answers parsed, the job model, and the judgement across ranks (the straggler,
the rank that never arrives). Pure: no network, no Textual; the client is
``sources.prometheus_api`` and the view ``ui.job_app``. This is its face."""

from __future__ import annotations

from .api import ApiError, Series, parse_vector
from .judge import Judgement, NeverArrives, Straggler, judge
from .model import PHASES, Job, JobSummary, RankState, build_job, job_summaries
from .promql import job_query, jobs_query, quote

__all__ = [
    "ApiError", "Job", "JobSummary", "Judgement", "NeverArrives", "PHASES", "RankState", "Series",
    "Straggler", "build_job", "job_query", "job_summaries", "jobs_query", "judge", "parse_vector", "quote",
]
