"""Errors meant for the user, and the one form every line gputop writes on standard error takes.

Every such line starts with the program and the command that runs (``gputop advise:``, or
``gputop:`` with no command), then ``error:`` or ``warning:`` where it is one, then the message:

    gputop advise: error: -p/--pid: not a process id: '0' (1 to 2147483647)
    gputop record: warning: cannot sample stacks of PID 1234 (...); recording its GPUs and the host without stacks
    gputop record: recorded 1m 30s to run.gputop (duration reached): 1,234 samples, 2.1 MB

An option's value gputop cannot use reads the same whether argparse's type check or the command
found it: ``<option>: <what is wrong>: '<value>' (<what is accepted>)``.
"""

from __future__ import annotations

import errno
import os
import sys

PROGRAM = "gputop"


class UserError(Exception):
    """Bad input or an unusable environment. ``str(exc)`` is the whole message."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def value_problem(problem: str, value: object, accepted: str | None = None) -> str:
    """``<what is wrong>: '<value>' (<what is accepted>)``: the part of an option's message after
    its name, as every argument type and command says it."""
    return f"{problem}: {str(value)!r}" + (f" ({accepted})" if accepted else "")


class OptionError(UserError):
    """An option's value found unusable after parsing (by the command, not argparse's type
    check): said as argparse says it, ``--listen: not HOST:PORT: 'abc' (e.g. 127.0.0.1:10405)``.
    Always bad input (status 2)."""

    def __init__(self, option: str, problem: str, value: object, accepted: str | None = None) -> None:
        super().__init__(f"{option}: {value_problem(problem, value, accepted)}", exit_code=2)
        self.option = option


def prog(command: str | None = None) -> str:
    """``gputop`` or ``gputop COMMAND``: what each line on standard error starts with."""
    return f"{PROGRAM} {command}" if command else PROGRAM


def line(command: str | None, message: str, kind: str | None = None) -> str:
    """``gputop COMMAND: [kind: ]message`` (kind: ``error``, ``warning``; None for a status line)."""
    return f"{prog(command)}: {kind + ': ' if kind else ''}{message}"


def say(command: str | None, message: str, kind: str | None = None) -> None:
    """Print ``line(...)`` on standard error, flushed (a status line must show before a long wait)."""
    print(line(command, message, kind), file=sys.stderr, flush=True)


def warn(command: str | None, message: str) -> None:
    say(command, message, "warning")


def os_reason(exc: OSError, path: object = None) -> str:
    """Why an operation on ``path`` failed, in gputop's words and lower case ("permission denied",
    "directory out does not exist", "t.txt is not a directory") rather than the C library's
    capitalised text. ``path``: the file gputop was creating or writing, to say which part of it
    is wrong."""
    code = getattr(exc, "errno", None)
    if path is not None:
        parent = os.path.dirname(os.fspath(path)) or "."
        if code == errno.ENOENT:
            if os.path.isdir(parent):  # /proc, /sys: a directory that takes no new files
                return f"{parent} does not take new files"
            return f"directory {parent} does not exist"
        if code == errno.ENOTDIR:
            # The first part of the path that is there and is not a directory.
            part = parent
            while part not in ("", ".", os.sep) and not os.path.exists(part):
                part = os.path.dirname(part)
            return f"{part} is not a directory" if part not in ("", ".", os.sep) else "a part of the path is not a directory"
        if code == errno.EISDIR:
            return f"{os.fspath(path)} is a directory"
    words = {errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.ENOSPC: "disk full",
             errno.EROFS: "read-only file system", errno.EDQUOT: "disk quota exceeded"}
    if code in words:
        return words[code]
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]
