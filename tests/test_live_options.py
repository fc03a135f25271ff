"""The live UI's options, from whichever parser started it (top level, attach, demo)."""

import argparse

from gputop.commands.live import LiveOptions
from gputop.session import DEFAULT_SAMPLE_RATE_HZ


def test_options_take_what_a_parser_gave_and_default_the_rest():
    top = argparse.Namespace(interval=2.0, stuck_after=30.0, fake=None, pid=123, sample_rate=3.0, func=print)
    o = LiveOptions.of(top)
    assert (o.pid, o.sample_rate, o.record, o.force) == (123, 3.0, None, False)
    attach = argparse.Namespace(interval=1.0, stuck_after=10.0, pid=7, record="run.gputop", command="attach")
    o = LiveOptions.of(attach)
    assert (o.pid, o.record, o.fake, o.sample_rate) == (7, "run.gputop", None, DEFAULT_SAMPLE_RATE_HZ)
