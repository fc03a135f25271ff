"""The live UI (`gputop`, `gputop --pid PID`, `gputop attach PID`, `gputop demo`): build the
session from the arguments, then hand the finished session to the UI."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from ..session import DEFAULT_SAMPLE_RATE_HZ


@dataclass(frozen=True)
class LiveOptions:
    """What the live UI is started with: the options every caller's parser may give, with the
    defaults of those it does not (`gputop attach` has --record, `demo` has no --pid)."""

    interval: float
    stuck_after: float
    fake: int | None = None
    pid: int | None = None
    sample_rate: float = DEFAULT_SAMPLE_RATE_HZ
    record: str | None = None
    force: bool = False

    @classmethod
    def of(cls, args: argparse.Namespace) -> "LiveOptions":
        given = vars(args)
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})


def run_live(args: argparse.Namespace) -> int:
    from ..session import UI_IDLE_ADVISOR_EVERY_S, Config, open_live
    from ..ui.app import run_app

    from . import startup_signals

    # SIGTERM / SIGHUP while the session opens (attaching, the recording's file) are noted here and
    # end the UI as soon as it is up, its recording closed: past startup_signals' hold they killed
    # the process where it stood.
    came: list[int] = []
    startup_signals.take(lambda signum, _frame: came.append(signum))
    opts = LiveOptions.of(args)
    session = open_live(Config(
        interval=opts.interval,
        fake=opts.fake,
        pid=opts.pid,
        stuck_after=opts.stuck_after,
        advisor_idle_every=UI_IDLE_ADVISOR_EVERY_S,
        sample_rate=opts.sample_rate,
        views=True,  # the Stacks and Ranks panes' views, computed off the UI thread
    ))
    if opts.record:
        try:
            session.start_recording(opts.record, force=opts.force)
        except BaseException:
            session.stop()
            raise
    return run_app(session, came, command=getattr(args, "command", None))
