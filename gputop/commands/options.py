"""Argument types and option groups every command shares (their defaults come from gputop.session).

A number the user types is checked here, at parse time: a process id the kernel could never
hand out, an interval of ``inf`` or ``nan``, or ``--fake -3`` is a usage error with one line,
not a traceback (or a silent zero) deep inside a source. Every time-like option takes the same
syntax (``90s``, ``30m``, ``1h30m``, ``2d`` or plain seconds), so ``advise --duration 30s`` means
what ``record --duration 30s`` means. This module imports nothing from ``gputop.cli``: the CLI
imports the commands, never the reverse.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from ..session import DEFAULT_INTERVAL_S as DEFAULT_INTERVAL
from ..session import DEFAULT_SAMPLE_RATE_HZ as DEFAULT_SAMPLE_RATE
from ..session import DEFAULT_STUCK_AFTER_S as DEFAULT_STUCK_AFTER
from ..errors import value_problem
from ..units import DURATION_UNITS, fmt_limit

# Below 0.1 s the polls cost gputop more than they tell: at 0.01 s the host, /proc and NVML reads
# took 71 % of a core (measured), at 0.1 s about a tenth of that, and NVML's utilisation buffer
# has 0.2 s points whatever the interval. Above an hour a live view shows nothing live. Either
# end is a typo, not a wish.
MIN_INTERVAL = 0.1
MAX_INTERVAL = 3600.0
# The longest span any duration option takes: a year. Larger values overflow timers and sleeps.
MAX_DURATION = 366 * 86400.0
# The scripted source draws one panel per GPU; a node has at most a few dozen.
MAX_FAKE_GPUS = 64
DEFAULT_FAKE_GPUS = 2
# A process id is a C pid_t, a signed 32-bit integer: a larger number overflows kill(2) and
# every library call that takes one. Smaller ids that name no process (above the kernel's pid_max
# included) are left to the attach checks, which say "no such process" with the PID.
PID_T_MAX = 2**31 - 1
# Stacks per second: below one every 10 s the breakdown of a 60 s window has too few to say
# anything; above 20 py-spy's own start-up (~10 ms a dump) would be most of a core.
MIN_SAMPLE_RATE = 0.1
MAX_SAMPLE_RATE = 20.0

_PART = r"(\d+(?:\.\d+)?)\s*([smhd])"
_SIZES = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3,
          "t": 1024**4, "tb": 1024**4}
# An empty recording (schema, first blocks) takes ~150 KB; below a megabyte a cap would stop
# recording almost at once.
MIN_MAX_SIZE = 1024 * 1024
# The most a cap can be: SQLite's page count stops at 2**32 - 2 pages, 16 TiB at its 4 KiB pages;
# a larger cap (--max-size 1e308) would say a limit that never applies.
MAX_MAX_SIZE = 16 * 1024**4


def _seconds(text: str) -> float:
    """'90s', '30m', '8h', '1h30m', '2d' or plain seconds; ValueError for anything else."""
    t = text.strip().lower()
    try:
        return float(t)
    except ValueError:
        if t.startswith("-") and t[1:2].isdigit():
            # A negative span (-5s, as -5 already was): the range check says what it must be,
            # not "not a duration".
            return -_seconds(t[1:])
        parts = re.findall(_PART, t)
        if not parts or re.sub(_PART, "", t).strip():
            raise ValueError(text) from None
        return sum(float(n) * DURATION_UNITS[u] for n, u in parts)


def duration_between(low: float, high: float, low_inclusive: bool = True):
    """An argparse type for a time span within [low, high] (or (low, high] when not inclusive).
    nan and inf are rejected: they pass comparisons that look like bounds checks."""

    def parse(text: str) -> float:
        try:
            v = _seconds(text)
        except ValueError:
            raise argparse.ArgumentTypeError(value_problem("not a duration", text, "try 90s, 30m, 8h or 1h30m")) from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(value_problem("not a finite duration", text))
        if low_inclusive and v < low or not low_inclusive and v <= low:
            least = f"at least {fmt_limit(low)}" if low_inclusive and low > 0 else "greater than 0"
            raise argparse.ArgumentTypeError(value_problem(f"must be {least}", text))
        if v > high:
            raise argparse.ArgumentTypeError(value_problem(f"must be at most {fmt_limit(high)}", text))
        return v

    return parse


# Any time span a command takes: `--duration 8h`, `--window 2m`, `--stuck-after 45s`.
parse_duration = duration_between(0.0, MAX_DURATION, low_inclusive=False)
_interval = duration_between(MIN_INTERVAL, MAX_INTERVAL)


def interval_arg(text: str) -> float:
    """The sampling interval: `--interval 0.5`, `--interval 5s`; below MIN_INTERVAL refused with why."""
    try:
        return _interval(text)
    except argparse.ArgumentTypeError as exc:
        if "at least" in str(exc):
            raise argparse.ArgumentTypeError(value_problem(
                f"must be at least {fmt_limit(MIN_INTERVAL)}", text, "shorter intervals cost gputop most of a core and "
                "see no more: NVML's utilisation points are 0.2 s apart")) from None
        raise
# Kept for callers that want "a positive number of seconds".
positive_float = parse_duration


def parse_size(text: str) -> int:
    """'500M', '2G', '1.5GB', plain bytes or a number as durations take it (1e9); at least a
    megabyte (a smaller cap stops at once), at most MAX_MAX_SIZE."""
    m = re.fullmatch(r"\s*(-?)(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*([kmgt]?b?)\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(value_problem("not a size", text, "try 500M or 2G"))
    if m.group(1):  # said as a negative duration is (-d -5)
        raise argparse.ArgumentTypeError(value_problem("must be greater than 0", text))
    v = float(m.group(2)) * _SIZES[m.group(3)]
    if v < MIN_MAX_SIZE:
        raise argparse.ArgumentTypeError(value_problem("must be at least 1M", text, "a smaller cap stops at once"))
    if v > MAX_MAX_SIZE:
        raise argparse.ArgumentTypeError(value_problem("must be at most 16T", text))
    return int(v)


def pid_arg(text: str) -> int:
    """A process id: a positive integer that fits a pid_t."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if not 0 < v <= PID_T_MAX:
        raise argparse.ArgumentTypeError(value_problem("not a process id", text, f"1 to {PID_T_MAX}"))
    return v


def count_between(low: int, high: int, what: str = ""):
    """An argparse type for a whole number within [low, high] (``--max-attach 8``)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(value_problem("not a whole number", text, f"{low} to {high}{what}")) from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(value_problem(f"must be {low} to {high}{what}", text))
        return v

    return parse


def fake_gpus(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(value_problem("not a number of GPUs", text, f"1 to {MAX_FAKE_GPUS}")) from None
    if not 1 <= v <= MAX_FAKE_GPUS:
        raise argparse.ArgumentTypeError(value_problem(f"must be 1 to {MAX_FAKE_GPUS} GPUs", text))
    return v


def add_live_options(p: argparse.ArgumentParser, with_pid: bool = True, pid_help: str | None = None) -> None:
    """Options shared by every command that samples a live machine."""
    p.add_argument(
        "-i",
        "--interval",
        type=interval_arg,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"sampling interval, {MIN_INTERVAL:g} s to {MAX_INTERVAL / 3600:g} h (default {DEFAULT_INTERVAL:g} s)",
    )
    p.add_argument(
        "--fake",
        nargs="?",
        const=DEFAULT_FAKE_GPUS,
        type=fake_gpus,
        metavar="N",
        help=f"use a scripted fake GPU source with N GPUs, 1 to {MAX_FAKE_GPUS} (default {DEFAULT_FAKE_GPUS}): "
        "try the UI without a GPU",
    )
    if with_pid:
        p.add_argument("-p", "--pid", type=pid_arg, help=pid_help or "attach to this training process (py-spy)")
    p.add_argument(
        "--sample-rate",
        type=sample_rate_arg,
        default=DEFAULT_SAMPLE_RATE,
        metavar="HZ",
        help=f"at most this many Python stacks per second from the attached job, {MIN_SAMPLE_RATE:g} to "
        f"{MAX_SAMPLE_RATE:g} (default {DEFAULT_SAMPLE_RATE:g}; gputop takes fewer when py-spy is costly "
        "here, and shows what sampling costs the job)",
    )


def sample_rate_arg(text: str) -> float:
    accepted = f"{MIN_SAMPLE_RATE:g} to {MAX_SAMPLE_RATE:g} stacks/s"
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(value_problem("not a number", text, accepted)) from None
    if not (MIN_SAMPLE_RATE <= v <= MAX_SAMPLE_RATE):  # also rejects nan
        raise argparse.ArgumentTypeError(value_problem(f"must be {accepted}", text))
    return v


def add_stuck_after(p: argparse.ArgumentParser, help: str, default: object = DEFAULT_STUCK_AFTER) -> None:
    """``--stuck-after``; ``default=argparse.SUPPRESS`` keeps a value given to the parent parser."""
    p.add_argument(
        "--stuck-after",
        type=parse_duration,
        default=default,
        metavar="TIME",
        help=f"{help} (default {DEFAULT_STUCK_AFTER:g} s)",
    )


def force_problem(args: argparse.Namespace) -> str | None:
    """The top-level ``--force`` only lets ``--record`` replace an old recording: alone it would
    be accepted and do nothing, and a user who typed it believes something was overwritten.
    ``report`` and ``record`` have their own ``-f/--force``, which sets the same attribute."""
    if getattr(args, "command", None) in ("report", "record"):
        return None
    if getattr(args, "force", False) and not getattr(args, "record", None):
        return "--force only applies with --record FILE (to overwrite an old recording)"
    return None


def terminal_problem() -> str | None:
    """Why the full-screen UI cannot run here, or None. It reads keys from stdin and draws on
    the terminal; with output redirected (``gputop > log``, nohup, a job script) it would write
    escape codes into a file for as long as it ran."""
    for name, stream in (("standard output", sys.stdout), ("standard input", sys.stdin),
                         ("standard error", sys.stderr)):
        try:
            ok = stream is not None and stream.isatty()
        except (AttributeError, ValueError):  # closed or replaced by an object without a fd
            ok = False
        if not ok:
            if stream is sys.stderr:
                # Textual's Linux driver draws on standard error (sys.__stderr__), not standard
                # output: `gputop 2>err.txt` would paint the whole UI into the file. Said so, or
                # the user cannot tell why a redirect of "only the errors" stops the UI.
                return ("it draws on standard error, which is not a terminal here: leave standard error on "
                        "the terminal")
            return f"{name} is not a terminal"
    return None


def require_terminal(replay: bool = False) -> None:
    """Raise a one-line UserError, before anything is started, when the UI has no terminal."""
    from ..errors import UserError

    problem = terminal_problem()
    if problem is None:
        return
    if replay:
        raise UserError(f"the replay UI needs a terminal ({problem}): without one, "
                        "`gputop report FILE` summarises a recording and `gputop info FILE` says what it holds")
    raise UserError(
        f"the live UI needs a terminal ({problem}): to log a session to a file use "
        "`gputop record -o FILE`, for findings as text `gputop advise`"
    )
