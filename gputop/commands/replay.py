"""`gputop replay FILE`: the live UI, driven by a recording.

Same panels, same analysis; the replay source plays the file back at ``--speed`` (1x by
default) from ``--start``. Keys add play/pause, speed, step and jumps (see the timeline).
"""

from __future__ import annotations

import argparse

from ..errors import OptionError, UserError, value_problem, warn
from .options import require_terminal


def speed_arg(text: str) -> float:
    t = text.strip().lower().rstrip("x")
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(value_problem("not a speed", text, "try 1, 10 or 60x")) from None
    if not 0 < v <= 1e6:
        raise argparse.ArgumentTypeError(value_problem("must be greater than 0 and at most 1000000", text,
                                                       "60 plays a minute a second"))
    return v


# A --start this far outside the recording is refused, not moved to its edge. Said out of range
# rather than clamped because a clamped start shows something other than what was asked, with
# nothing on screen to say so (+99h for +99s starts at the last frame), and the other forms
# already refuse out-of-range values (150%, a clock time the recording does not contain, within
# the same second of slack).
START_SLACK_S = 1.0


def outside_problem(text: str, start: float, end: float) -> None:
    """Raise a one-line UserError when ``--start TEXT`` lies outside the recording."""
    from ..units import fmt_length
    from ..record import parse_position

    try:
        pos = parse_position(text, start, end)
    except ValueError as exc:  # open_replay said so already; here for direct callers
        raise UserError(f"--start: {exc}") from None
    if start - START_SLACK_S <= pos <= end + START_SLACK_S:
        return
    length = fmt_length(end - start)
    if pos > end:
        raise OptionError("--start", "after the end of the recording", text,
                          f"it is {length} long; -1m starts a minute before the end")
    raise OptionError("--start", "before the start of the recording", text,
                      f"it is {length} long; +0 starts at its beginning")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a recording in the same UI (play, pause, speed, jump to idle periods and findings)",
        description="Open a recording made by `gputop record` (or `gputop --record`) in the live UI. "
        "Space plays/pauses, +/- change the speed, , and . step, x/X jump to the next/previous idle "
        "period, f/F to the next/previous finding, g goes to a time.",
    )
    p.add_argument("file", metavar="FILE", help="the recording")
    p.add_argument("-s", "--speed", type=speed_arg, default=1.0, metavar="X",
                   help="playback speed: 1 = real time, 60 = a minute a second (default 1)")
    p.add_argument("--start", metavar="TIME",
                   help="where to start: +90s, +1h30m (from the start), -5m (before the end), 14:03[:30], "
                   "2026-11-22 14:03, or 50%%")
    p.add_argument("--paused", action="store_true", help="open paused at the start position")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..session import open_replay

    session = open_replay(args.file, args.speed, args.start, args.paused, views=True)
    try:
        if args.start:
            outside_problem(args.start, session.replay.start_ts, session.replay.end_ts)
        require_terminal(replay=True)  # a bad file or --start is said first; nothing has started yet
    except UserError:
        session.stop()
        raise
    if session.replay.damage:
        warn("replay", session.replay.damage)
    from ..ui.app import run_app

    return run_app(session, command="replay")
