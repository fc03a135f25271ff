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


def build_replay_session(path, speed: float = 1.0, start: str | None = None, paused: bool = False,
                         advisor: bool = True):
    """A Session whose only source is the recording. Raises UserError for a bad file or time."""
    from ..live import Session
    from ..pipeline import Pipeline
    from ..record.reader import Reader
    from ..sources.replay import ReplaySource, parse_position
    from ..store import Store

    reader = Reader(path)
    try:
        pos = None
        if start:
            try:
                pos = parse_position(start, reader.start_ts, reader.end_ts)
            except ValueError as exc:
                raise UserError(f"--start: {exc}") from None
        store = Store()
        source = ReplaySource(reader, store=store, speed=speed, start=pos, paused=paused)
        pipeline = Pipeline(store, [source], clock=lambda: source.position)
        source.attach(pipeline.publish)
        last = reader.sessions[-1] if reader.sessions else {}
        session = Session(store=store, pipeline=pipeline, sources={"replay": source},
                          target_pid=last.get("target_pid"), mode="replay", interval=last.get("interval") or 2.0)
    except BaseException:
        reader.close()
        raise
    if advisor:
        try:
            from ..advisor.engine import add_advisor

            session.sources["advisor"] = add_advisor(session)
        except ImportError:
            pass
    return session


def run(args: argparse.Namespace) -> int:
    session = build_replay_session(args.file, args.speed, args.start, args.paused)
    source = session.sources["replay"]
    try:
        require_terminal()  # a bad file or --start is said first; nothing has started yet
    except UserError:
        source.reader.close()
        raise
    if source.damage:
        print(f"gputop: warning: {source.damage}", file=sys.stderr)
    # The header's "every Ns" and the refresh rate follow the recording's own interval.
    last = source.reader.sessions[-1] if source.reader.sessions else {}
    args.interval = last.get("interval") or 1.0
    from ..ui.app import run_session

    return run_session(session, args)
