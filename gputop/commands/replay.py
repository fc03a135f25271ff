"""`gputop replay FILE`: the live UI, driven by a recording.

Same panels, same analysis; the replay source plays the file back at ``--speed`` (1x by
default) from ``--start``. Keys add play/pause, speed, step and jumps (see the timeline).
"""

from __future__ import annotations

import argparse
import sys

from ..errors import UserError
from .options import require_terminal


def speed_arg(text: str) -> float:
    t = text.strip().lower().rstrip("x")
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a speed: {text!r} (try 1, 10 or 60x)") from None
    if not 0 < v <= 1e6:
        raise argparse.ArgumentTypeError(f"speed out of range: {text!r}")
    return v


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
        require_terminal(replay=True)  # a bad file or --start is said first; nothing has started yet
    except UserError:
        session.stop()
        raise
    if session.replay.damage:
        print(f"gputop: warning: {session.replay.damage}", file=sys.stderr)
    from ..ui.app import run_app

    return run_app(session)
