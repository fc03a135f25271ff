"""Command line: `gputop` (live UI) and its subcommands.

Each subcommand lives in ``gputop/commands/<name>.py`` with ``register(subparsers)``; heavy
imports happen inside the command's run function so ``gputop --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import UserError

# Order is the order in --help.
COMMANDS = ("attach", "stacks", "advise", "record", "replay", "report", "info", "demo", "doctor")

# NVML keeps a 200 ms utilisation buffer (~14 s deep) that every poll drains, so a 2 s poll loses
# no GPU detail while halving the cost of redrawing the screen (the same default as nvitop).
DEFAULT_INTERVAL = 2.0


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0: {text!r}")
    return v


def pid_arg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return v


def add_live_options(p: argparse.ArgumentParser, with_pid: bool = True) -> None:
    """Options shared by every command that samples a live machine."""
    p.add_argument(
        "-i",
        "--interval",
        type=positive_float,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"sampling interval (default {DEFAULT_INTERVAL:g} s)",
    )
    p.add_argument(
        "--fake",
        nargs="?",
        const=2,
        type=int,
        metavar="N",
        help="use a scripted fake GPU source with N GPUs (default 2): try the UI without a GPU",
    )
    if with_pid:
        p.add_argument("-p", "--pid", type=pid_arg, help="attach to this training process (py-spy)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gputop",
        description="Live monitor and advisor for GPU training jobs.",
        epilog="Run 'gputop COMMAND --help' for a command's options. Keys in the UI: press '?'.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"gputop {__version__}")
    add_live_options(parser)
    parser.add_argument("--record", metavar="FILE", help="also record the session to FILE")
    parser.add_argument("--force", action="store_true", help="with --record: overwrite FILE if it is an old recording")
    parser.add_argument(
        "--stuck-after",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="report an attached job as stuck after this long without progress (default 30)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"{__package__}.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.commands.{name}":
                continue  # not built yet
            raise
        mod.register(sub)
    parser.set_defaults(func=_run_live)
    return parser


def _run_live(args: argparse.Namespace) -> int:
    from .ui.app import run_live

    return run_live(args)


def _glue_negative_values(argv: list[str]) -> list[str]:
    """``--start -5m`` means a time before the end, not an option: pass it as ``--start=-5m``."""
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--start":
            nxt = next(it, None)
            if nxt is not None and nxt.startswith("-") and len(nxt) > 1 and nxt[1].isdigit():
                out.append(f"--start={nxt}")
                continue
            out.append(arg)
            if nxt is not None:
                out.append(nxt)
            continue
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_glue_negative_values(sys.argv[1:] if argv is None else list(argv)))
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"gputop: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
