"""A wait of nearly all the time bounds nothing: 1 / (1 - f) runs to its cap, and the gain says
so instead of "at most 100x"."""

from __future__ import annotations

from synth import Job, rule_findings

from gputop.advisor.rules.base import ShareLimit, gain, wait_bound
from gputop.model import Category


def test_a_wait_of_all_the_time_states_no_bound():
    text = gain(0.995)
    assert "100x" not in text and "at most" not in text
    assert text.startswith("no bound stated: the wait takes 100 % of the time, nearly all of it")
    assert "limited by what the fix gives back" in text
    # From samples, the upper limit reaches 100 %: said, and still no number.
    sampled = gain(0.9, upper=ShareLimit(1.0, 30))
    assert "(up to 100 % at 95 % confidence from 30 stack samples)" in sampled and "x steps/s" not in sampled


def test_the_fixs_own_limit_stays_and_the_wait_is_not_a_number():
    text = gain(1.0, limit=2.0, limited_by="2 workers on 2 cores")
    assert text.startswith("at most 2.0x steps/s (an upper bound), limited by 2 workers on 2 cores; ")
    assert text.endswith("the wait takes 100 % of the time, nearly all of it: alone it bounds nothing")
    assert "100x" not in text


def test_a_meaningful_bound_is_still_stated():
    assert gain(0.96) == "at most 25x steps/s (an upper bound: if the 96 % of the time this costs came back in full)"
    assert "would allow 2.5x" in gain(0.6, limit=1.5, limited_by="x")
    assert wait_bound(1.0) == 100.0  # the cap the phrase is chosen at


def test_a_job_waiting_all_the_time_gets_no_100x():
    job = Job(seconds=20.0, util=lambda t: 0.0, main=lambda t: Category.DATA_FETCH)
    found, _ = rule_findings(job)
    texts = [f.expected_gain for f in found.values() if f.expected_gain]
    assert texts and not any("100x" in t for t in texts), texts
