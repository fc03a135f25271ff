"""Save an SVG screenshot of `gputop job`, the job view across hosts, over a real run.

    python scripts/screenshot_job.py --out screenshots --name job-two-hosts --size 120x40

Runs the CPU setup of the across-hosts test (tests/two_hosts.py: 4-rank torchrun gloo jobs, each
split over two loopback "hosts" with their own `gputop export --attach all`, a real Prometheus
scraping both), waits until the view names the case, then draws the real `JobApp` over the real
Prometheus answers and writes ``OUT/NAME.svg``. Needs torch and the `prometheus` binary.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from gputop.commands.job import JobWatch  # noqa: E402
from gputop.ui.job_app import JobApp  # noqa: E402

JOB = "train-llm"
DEADLINE_S = 150.0


def _named(api: str, case: str) -> bool:
    from two_hosts import verdict

    got = verdict(api, JOB)
    if got is None:
        return False
    j = got[1]
    return bool(j.straggler) if case == "straggler" else bool(j.never_arrives)


async def _shoot(api: str, size: tuple[int, int], out: Path, interval: float) -> None:
    watch = JobWatch(api, JOB, interval)
    app = JobApp(watch, interval, first=watch())
    async with app.run_test(size=size) as pilot:
        await pilot.pause(2 * interval)
        app.save_screenshot(str(out))


def main() -> int:
    from two_hosts import TwoHosts

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="screenshots")
    p.add_argument("--name", default="job-two-hosts")
    p.add_argument("--size", default="120x40")
    p.add_argument("--case", choices=("straggler", "hang"), default="straggler")
    p.add_argument("--interval", type=float, default=5.0, help="the view's step, as `gputop job`'s")
    args = p.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    odd = 3 if args.case == "straggler" else 1
    out = Path(args.out) / f"{args.name}.svg"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, TwoHosts(Path(tmp), {JOB: (args.case, odd)}) as hosts:
        while not _named(hosts.api, args.case):
            hosts.check_alive()
            if time.monotonic() - hosts.t0 > DEADLINE_S:
                print(f"the view did not name the {args.case} in {DEADLINE_S:.0f} s", file=sys.stderr)
                return 1
            time.sleep(1.0)
        asyncio.run(_shoot(hosts.api, (w, h), out, args.interval))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
