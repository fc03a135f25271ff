"""With no findings, a wait the breakdown shows past the cost bar is said, not denied; and every
surface formats a gain bound with the advisor's one formatter.

The new user's starved.py (2 workers sleeping in __getitem__) printed "D waiting for data 19.1 s
100 %" and then "No findings: nothing in this window costs the job a visible share of its time";
the live UI printed "at most 1e+02x" where advise printed "100x"."""

from __future__ import annotations

from gputop.advisor.rules.base import times
from gputop.analysis import CPU_DEVICE, Breakdown, Bucket
from gputop.model import Finding, Severity
from gputop.present import findings_text, verdict_line
from gputop.present.advice import advice_pane_lines

WAITING = Breakdown(CPU_DEVICE, 0.0, 19.1, {Bucket.DATA: 19.1}, attributed=True)
HEALTHY = Breakdown(0, 0.0, 60.0, {Bucket.BUSY: 57.0, Bucket.DATA: 3.0}, attributed=True)


def _plain(lines) -> str:
    return " ".join("".join(part[0] for part in ln) for ln in lines)


def test_a_data_wait_with_no_finding_is_said_not_denied():
    text = findings_text([], breakdowns=[WAITING])
    assert "nothing in this window costs" not in text
    assert "CPU (no GPU) is waiting for data 100 % of the window" in text.replace("\n", " ")
    pane = _plain(advice_pane_lines([], [WAITING], has_gpu=False))
    assert "nothing costs the job" not in pane and "waiting for data 100 %" in pane


def test_a_wait_under_the_cost_bar_still_reads_no_findings():
    assert findings_text([], breakdowns=[HEALTHY]).startswith("No findings: nothing in this window costs")
    assert findings_text([]).startswith("No findings")  # no breakdowns given: as before


def test_the_verdict_line_formats_the_bound_as_the_gain_text_does():
    f = Finding("blocking-in-loop", "The loop sleeps", Severity.WARNING, 0.9, (), "a", gain_predicted=99.5)
    line = "".join(part[0] for part in verdict_line([f], 200))
    assert "at most 100x" in line and "e+" not in line
    assert times(99.5) == "100x" and times(1.234) == "1.2x" and times(12.4) == "12x"


def test_a_collective_wait_with_no_finding_is_said_with_its_own_look_alikes_and_the_pid():
    # A new user's DDP job: the collective wait was explained with a data wait's look-alikes and a
    # literal `--pid PID` beside the PID advise knew.
    waits = Breakdown(CPU_DEVICE, 0.0, 30.0, {Bucket.BUSY: 17.0, Bucket.COLLECTIVE: 13.0}, attributed=True)
    text = " ".join(findings_text([], breakdowns=[waits], pid=17923).split())
    assert "collective/communication wait 43 %" in text
    assert "which rank the others wait for" in text and "loader workers" not in text
    assert "`gputop stacks --pid 17923`" in text
