"""Command line: `gputop` (live UI) and its subcommands.

Each subcommand lives in ``gputop/commands/<name>.py`` with ``register(subparsers)``; heavy
imports happen inside the command's run function so ``gputop --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from . import __version__
from .commands import startup_signals
from .commands.options import DEFAULT_INTERVAL, add_live_options, add_stuck_after, force_problem, require_terminal
from .errors import UserError, line, value_problem

__all__ = ["COMMANDS", "DEFAULT_INTERVAL", "build_parser", "main"]

# Order is the order in --help.
COMMANDS = ("attach", "stacks", "advise", "record", "replay", "report", "info", "demo", "doctor", "export", "job",
            "autopsy", "rules")


class _OneLineParser(argparse.ArgumentParser):
    """Bad input is one line and exit status 2 (the README's promise), not the usage block above
    it. A value an option cannot take reads as gputop's own checks say it (errors.OptionError):
    ``-p/--pid: not a process id: '0' (1 to 2147483647)``, the accepted values in the message;
    anything else (an unknown option, a missing value) adds where the options are listed."""

    _value_problem = False

    def _get_value(self, action, arg_string):  # type: ignore[override]
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError:
            self._value_problem = True
            raise

    def _check_value(self, action, value):  # type: ignore[override]
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            self._value_problem = True
            if isinstance(action, argparse._SubParsersAction):
                raise argparse.ArgumentError(
                    None, value_problem("not a command", value, ", ".join(action.choices))) from None
            raise

    def error(self, message: str):  # type: ignore[override]
        # argparse's "argument -p/--pid: ..." is gputop's "-p/--pid: ...".
        message = re.sub(r"\bargument (?=-|[A-Z])", "", message)
        hint = "" if self._value_problem else f"; options: {self.prog} --help"
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


class _CommandParser(_OneLineParser):
    """A subcommand's parser. argparse hands the arguments a subcommand does not know back to the
    top-level parser, which then prints gputop's usage for ``gputop export --port``: the user
    learns nothing about export's options. A subcommand reports them itself, with its own usage."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(self, extras)}")
        return ns, extras


def _did_you_mean(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """' (did you mean --listen HOST:PORT?)' for an option this command spells otherwise: a near
    spelling (``--lisen``), or a word its value names (``--port`` is the PORT of ``--listen``)."""
    import difflib
    import re

    first = next((e for e in extras if e.startswith("-")), None)
    if first is None:
        return ""
    name = first.split("=", 1)[0]
    word = name.lstrip("-").upper()
    for action in parser._actions:
        if action.option_strings and isinstance(action.metavar, str) and word in re.split(r"\W+", action.metavar):
            return f" (did you mean {action.option_strings[-1]} {action.metavar}?)"
    close = difflib.get_close_matches(name, list(parser._option_string_actions), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def command_parser(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand ``name`` (the top-level one when there is none): its errors
    print its usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="gputop",
        description="Live monitor and advisor for GPU training jobs.",
        epilog="Run 'gputop COMMAND --help' for a command's options. Keys in the UI: press '?'.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"gputop {__version__}")
    add_live_options(parser)
    parser.add_argument("--record", metavar="FILE", help="also record the session to FILE")
    parser.add_argument("--force", action="store_true", help="with --record: overwrite FILE if it is an old recording")
    add_stuck_after(parser, "report an attached job as stuck after this long without progress")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.commands.{name}").register(sub)
    parser.set_defaults(func=_run_live)
    return parser


def _run_live(args: argparse.Namespace) -> int:
    require_terminal()  # before the session starts: no sampling threads, no recording file
    from .commands.live import run_live

    return run_live(args)


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option, of gputop and of its commands, that takes exactly one value."""
    out: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _value_options(sub)
        elif action.option_strings and action.nargs is None:
            out.update(action.option_strings)
    return out


def _glue_negative_values(argv: list[str], options: set[str] = frozenset({"--start"})) -> list[str]:
    """A value that starts with '-' and a digit is the option's value, not an option: ``--start
    -5m`` (a time before the end) is passed as ``--start=-5m``; ``--max-size -1G`` or ``-d -5s``
    then get their type's message ("must be greater than 0") instead of argparse's "expected one
    argument" (which it gives for any such value but a bare number: ``-d -5``)."""
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--":
            out.append(arg)
            out.extend(it)
            break
        if arg in options:
            nxt = next(it, None)
            if nxt is not None and nxt.startswith("-") and len(nxt) > 1 and (nxt[1].isdigit() or nxt[1] == "."):
                # A short option takes its value joined to it (-d-5s); a long one after '='.
                out.append(f"{arg}={nxt}" if arg.startswith("--") else f"{arg}{nxt}")
                continue
            out.append(arg)
            if nxt is not None:
                out.append(nxt)
            continue
        out.append(arg)
    return out


def _bare_fake_before_command(argv: list[str]) -> list[str]:
    """``gputop --fake advise``: ``--fake`` takes an optional count, and argparse gave it the
    command's name ("not a number of GPUs: 'advise'"). A command's name right after gputop's own
    ``--fake`` (or an abbreviation argparse takes for it) is the command: ``--fake`` gets its
    default count, as ``gputop advise --fake`` does."""
    from .commands.options import DEFAULT_FAKE_GPUS

    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--" or arg in COMMANDS:
            break  # past gputop's own options
        if len(arg) >= 4 and "--fake".startswith(arg) and out[i + 1] in COMMANDS:
            out[i] = f"--fake={DEFAULT_FAKE_GPUS}"
            break
    return out


def _typed_before_command(argv: list[str], command: str | None, option: str) -> bool:
    """Whether ``option`` (or an abbreviation argparse takes for it) was typed before ``command``:
    then it is gputop's own (``gputop --force attach 1``), not the command's (``advise -f``)."""
    at = argv.index(command) if command in argv else len(argv)
    return any(len(a) > 3 and option.startswith(a) for a in argv[:at])


def _command_at(parser: argparse.ArgumentParser, argv: list[str], command: str) -> int | None:
    """Where ``command`` stands in ``argv``: the first time it is not an option's value."""
    takes_value = {s for a in parser._actions if a.option_strings and a.nargs is None for s in a.option_strings}
    for i, arg in enumerate(argv):
        if arg == command and (i == 0 or argv[i - 1] not in takes_value):
            return i
    return None


def _options_before_command(parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace) -> None:
    """gputop's own options typed before a command (``gputop --pid 1234 advise``): the command's
    parser wrote its defaults over them, and advise watched without attaching, exit 0. A value
    typed there now reaches the command where it has the same option and it was not typed after
    it too (as attach's ``--record`` and stacks' ``--pid`` always did); elsewhere it is refused in
    one line. ``--force`` is left to force_problem."""
    at = _command_at(parser, argv, args.command)
    if not at:
        return
    before, defaults = parser.parse_args(argv[:at]), parser.parse_args([])
    sub = command_parser(parser, args.command)
    after = sub.parse_args(argv[at + 1:])
    own = {a.dest: a for a in sub._actions if a.option_strings}
    for action in parser._actions:
        dest = action.dest
        if not action.option_strings or dest in ("help", "version", "force"):
            continue
        value = getattr(before, dest)
        if value == getattr(defaults, dest):
            continue  # not typed before the command
        name = "/".join(action.option_strings)
        mine = own.get(dest)
        if mine is not None and getattr(args, dest, None) == value:
            continue  # it reached the command (stacks' --pid, attach's --record)
        if mine is None or mine.type is not action.type:
            sub.error(f"{name} given before '{args.command}' does not apply to it")
        if getattr(after, dest) == mine.default:  # not typed after the command: the one typed before counts
            setattr(args, dest, value)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = _glue_negative_values(sys.argv[1:] if argv is None else list(argv), _value_options(parser))
    argv = _bare_fake_before_command(argv)
    args = parser.parse_args(argv)
    if args.command is not None:
        _options_before_command(parser, argv, args)
    problem = force_problem(args)
    if problem:
        own = _typed_before_command(argv, args.command, "--force")
        (parser if own else command_parser(parser, args.command)).error(problem)
    try:
        # A Ctrl-C held while gputop loaded (startup_signals) ends it here, as one in the command
        # does; a command that stops cleanly on it (`record`) takes it instead.
        if not getattr(args, "takes_interrupt", False) and startup_signals.release_interrupt():
            raise KeyboardInterrupt
        return int(args.func(args) or 0)
    except UserError as exc:
        # The command that ran names the line, as its argparse errors do (errors.line).
        print(line(args.command, str(exc), "error"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        # One line, never a traceback (the README's promise); 130 is the status a shell gives a
        # command Ctrl-C ended.
        print(line(args.command, "interrupted"), file=sys.stderr)
        # A KeyboardInterrupt that went through code run by exec() of a string (dataclasses make
        # their methods so while a module is imported) leaves CPython's "^C went unhandled" mark
        # set, caught or not, and `python -m gputop` then ends by SIGINT (status -2, not 130): one
        # Ctrl-C in ~15 while advise started. Each exec() of a string clears that mark first.
        exec("pass")  # noqa: S102
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
