"""The job view's app at 80x24 with 64 ranks on 8 hosts: the verdict stays on screen, the ranks
scroll under it grouped by host, a failed refresh keeps the last answer and says why."""

from __future__ import annotations

from gputop.fleet import build_job, judge, parse_vector
from gputop.ui.job_app import JobApp
from gputop.ui.lines_view import LinesView

from job_series import job_payload


def _job(**kw):
    job = build_job("exp-42", parse_vector(job_payload(64, **kw)))
    return job, judge(job)


async def test_64_ranks_at_80x24_grouped_by_host_and_scrolled():
    def fetch():  # the first answer is given; every refresh after it fails
        raise RuntimeError("cannot reach http://prom:9090: Connection refused")

    app = JobApp(fetch, interval=60.0, first=_job(straggler=45))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        top = app.query_one("#job-top", LinesView).plain
        assert "64 of 64 ranks on 8 hosts" in top
        assert "Straggler: rank 45 on node-005 · data 61%" in top
        assert "63 ranks wait 50% of their time in all_reduce" in top
        ranks = app.query_one("#job-ranks", LinesView).plain.splitlines()
        assert len(ranks) == 1 + 8 + 64  # the header, a line per host, a line per rank
        assert ranks[1].startswith("node-000 · 8 ranks") and ranks[-1].lstrip().startswith("63 ")
        assert all(len(line) <= 77 for line in ranks)
        scroll = app.query_one("#job-scroll")
        assert scroll.max_scroll_y > 0  # 73 lines in what is left of 24 rows
        for _ in range(8):
            await pilot.press("pagedown")
        await pilot.pause()
        assert scroll.scroll_y == scroll.max_scroll_y
        await pilot.press("r")  # a refresh that fails: the last answer stays, the status says why
        await pilot.pause(0.3)
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "refresh failed: cannot reach" in app.query_one("#job-status", LinesView).plain
        assert "Straggler: rank 45" in app.query_one("#job-top", LinesView).plain
