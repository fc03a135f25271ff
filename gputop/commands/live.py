"""The live UI (`gputop`, `gputop --pid PID`, `gputop attach PID`, `gputop demo`): build the
session from the arguments, then hand the finished session to the UI."""

from __future__ import annotations

import argparse


def run_live(args: argparse.Namespace) -> int:
    from ..session import DEFAULT_SAMPLE_RATE_HZ, UI_IDLE_ADVISOR_EVERY_S, Config, open_live
    from ..ui.app import run_app

    session = open_live(Config(
        interval=args.interval,
        fake=getattr(args, "fake", None),
        pid=getattr(args, "pid", None),
        stuck_after=args.stuck_after,
        advisor_idle_every=UI_IDLE_ADVISOR_EVERY_S,
        sample_rate=getattr(args, "sample_rate", DEFAULT_SAMPLE_RATE_HZ),
        views=True,  # the Stacks and Ranks panes' views, computed off the UI thread
    ))
    record = getattr(args, "record", None)
    if record:
        try:
            session.start_recording(record, force=getattr(args, "force", False))
        except BaseException:
            session.stop()
            raise
    return run_app(session)
