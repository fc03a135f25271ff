"""Save an SVG screenshot of the live UI, headless (no terminal needed).

    python scripts/screenshot.py --out screenshots --name live --size 160x48 --seconds 8 [--pid PID] [--fake 2]

Runs the real sources and pipeline for ``--seconds``, presses ``--keys`` (e.g. "2" for the
advisor tab), then writes ``OUT/NAME.svg``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputop.session import UI_IDLE_ADVISOR_EVERY_S, Config, open_live, open_replay  # noqa: E402
from gputop.ui.app import GputopApp  # noqa: E402


async def shoot(args: argparse.Namespace) -> Path:
    w, h = (int(x) for x in args.size.split("x"))
    if args.replay:
        session = open_replay(args.replay, speed=args.speed, start=args.start, views=True)
    else:
        session = open_live(Config(interval=args.interval, fake=args.fake, pid=args.pid,
                                   advisor_idle_every=UI_IDLE_ADVISOR_EVERY_S,
                                   views=True))  # the Stacks and Ranks panes' views, as `gputop` has them
    app = GputopApp(session, interval=args.interval)
    session.pipeline.start()
    try:
        async with app.run_test(size=(w, h)) as pilot:
            await pilot.pause(args.seconds)
            for key in args.keys.split(",") if args.keys else []:
                await pilot.press(key)
                await pilot.pause(0.5)
            app.tick(force=True)
            await pilot.pause(0.3)
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"{args.name}.svg"
            app.save_screenshot(str(path))
            return path
    finally:
        session.pipeline.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="screenshots")
    p.add_argument("--name", default="gputop")
    p.add_argument("--size", default="160x48")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--fake", type=int)
    p.add_argument("--pid", type=int)
    p.add_argument("--keys", default="", help="comma-separated keys to press before the shot")
    p.add_argument("--replay", help="a recording to replay instead of the live machine")
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--start", help="replay start position, e.g. 50%% or +30s")
    args = p.parse_args()
    print(asyncio.run(shoot(args)))


if __name__ == "__main__":
    main()
