"""`gputop report FILE [-o report.html]`: what happened in a recorded run.

Per-GPU busy and idle time and where the idle time went, the longest idle periods and their
cause, the findings with their evidence, timeline charts. Text on the terminal by default,
``--json`` the numbers, ``--html`` the page. ``-o FILE`` writes the report there instead of
printing it: ``x.html`` one self-contained page (inline SVG, no scripts), ``x.txt`` the text,
``x.json`` the numbers; a flag picks the format of a file named otherwise, and a flag that
contradicts the name (``--json -o x.html``) is refused. ``-o -`` is standard output (nothing named
``-`` is written). A report is never written over a recording, ``--force`` or not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

from ..errors import OptionError, UserError, os_reason, say, warn


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="summarise a recording: utilisation, idle time and its causes, findings, charts (text or HTML)",
        description="Summarise a recording made by `gputop record`. Prints text; -o FILE.html writes a "
        "self-contained HTML page with charts.",
    )
    p.add_argument("file", metavar="FILE", help="the recording")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write to OUT instead of printing: .html, .txt or .json by its name (HTML for a name "
                   "without an extension; another extension is refused) unless --text/--json/--html says; - is standard output (text unless a flag says)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--text", action="store_true", help="the text report (the default without -o)")
    shown.add_argument("--json", action="store_true", help="the numbers as JSON")
    shown.add_argument("--html", action="store_true", help="the HTML page (e.g. with -o - into a pipe)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite OUT if it exists (never a recording)")
    p.set_defaults(func=run)


# What a file's name says it holds; a name not listed gets what a flag asks for, else HTML.
_BY_SUFFIX = {".html": "html", ".htm": "html", ".json": "json", ".txt": "text"}


def output_format(args: argparse.Namespace, out: Path | None) -> str:
    """``text``, ``json`` or ``html``: the flag's, else what the output's name says. A flag that
    contradicts the name (``--json -o x.html``) is refused rather than one of them ignored."""
    flag = "json" if args.json else "html" if args.html else "text" if args.text else None
    if out is None:
        return flag or "text"
    named = _BY_SUFFIX.get(out.suffix.lower())
    if flag and named and flag != named:
        raise UserError(f"--{flag} asks for {_NAMES[flag]} but {out} is named as {_NAMES[named]}: drop --{flag} "
                        f"or name the file {_renamed(out, _SUFFIX[flag])}")
    suffix = out.suffix.lower()
    # (.gputop is left to the refusal that names the recording it would overwrite.)
    if not flag and not named and suffix[1:].isalpha() and suffix != ".gputop":
        # A name that says another format (r.pdf, r.png, r.md) would get HTML it does not hold.
        raise OptionError("-o/--output", f"a format gputop does not write ({suffix})", out,
                          f"name it {_renamed(out, '.html')}, {_renamed(out, '.txt')} or {_renamed(out, '.json')}, "
                          "or pass --html, --text or --json")
    return flag or named or "html"


def _renamed(out: Path, suffix: str) -> Path:
    """``out`` named for ``suffix``: its last extension replaced, and one before it that names a
    format too (``x.json.gz`` -> ``x.html``, not ``x.json.html``)."""
    base = out.with_suffix("")
    if base.suffix.lower() in _BY_SUFFIX:
        base = base.with_suffix("")
    return base.with_name(base.name + suffix)


_NAMES = {"html": "HTML", "json": "JSON", "text": "text"}
_SUFFIX = {"html": ".html", "json": ".json", "text": ".txt"}


def run(args: argparse.Namespace) -> int:
    from ..record import Reader
    from ..record import refuse_overwriting_recording
    from ..report import collect, render_html, render_text, summary_dict

    # `-o -` is standard output, as for most tools: never a file named "-".
    out = Path(args.output) if args.output and args.output != "-" else None
    descriptor = _own_descriptor(out) if out is not None else None
    if descriptor is not None:
        out = None  # `-o /dev/stdout`: as `-o -` (--force replaced the link with a file: as root, /dev/stdout)
    fmt = output_format(args, out)
    if out is not None:
        if out.is_dir():
            raise UserError(f"{out} is a directory: give a file name, e.g. {out / 'report.html'}")
        # Before --force is looked at: a report never replaces a recording (the one it reads,
        # by any name or link, or another one), whatever the output's name says.
        refuse_overwriting_recording(out, reading=Path(args.file))
        if (out.exists() or out.is_symlink()) and not args.force:
            raise UserError(f"{out} already exists: use --force to overwrite it")
        if not out.parent.exists() and str(out.parent) not in ("", "."):
            raise UserError(f"cannot write {out}: directory {out.parent} does not exist")
    with Reader(args.file) as reader:
        summary = collect(reader)
    if summary.damage:
        warn("report", summary.damage)
    if fmt == "json":
        body = json.dumps(summary_dict(summary), indent=2, default=str) + "\n"
    elif fmt == "html":
        body = render_html(summary)
    else:
        width = 100 if out is not None else min(shutil.get_terminal_size((100, 24)).columns, 140)
        body = render_text(summary, width)
    if out is None and descriptor not in (None, 1):
        with os.fdopen(os.dup(descriptor), "w", encoding="utf-8") as f:
            f.write(body)  # as the shell opened it: `2>>log` appends
    elif out is None:
        sys.stdout.write(body)
    else:
        # The file holds the report; the terminal gets only where it went.
        _write(out, body, args.force)
        say("report", f"wrote {out}")
    return 0


def _own_descriptor(path: Path) -> int | None:
    """N where ``path`` names one of gputop's own descriptors (/dev/stdout, /dev/fd/N,
    /proc/self/fd/N, through links): written to as the descriptor, never replaced or truncated."""
    p = os.path.abspath(path)
    for _ in range(8):
        parent = os.path.realpath(os.path.dirname(p))  # /proc/self/fd, /dev/fd -> /proc/PID/fd
        m = re.fullmatch(rf"/proc/{os.getpid()}/fd/(\d+)", os.path.join(parent, os.path.basename(p)))
        if m:
            return int(m.group(1))
        if not os.path.islink(p):
            return None
        p = os.path.normpath(os.path.join(parent, os.readlink(p)))
    return None


def _write(path: Path, body: str, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    # A link to a pipe or a terminal (/dev/stdout -> /proc/self/fd/1) is written through: --force
    # replaced it with a file, and as root /dev/stdout was a regular file for every program after.
    through = path.is_symlink() and path.exists() and not path.is_file()
    try:
        if force and path.is_symlink() and not through:
            path.unlink()
        # 0600, as for recordings: a report holds the job's command line, stack frames and
        # file paths. Share it on purpose (chmod), not by a default that lets every local user read it.
        fd = os.open(path, flags | (0 if through else getattr(os, "O_NOFOLLOW", 0)), 0o600)
    except FileExistsError:
        raise UserError(f"{path} already exists: use --force to overwrite it") from None
    except OSError as exc:
        raise UserError(f"cannot write {path}: {os_reason(exc, path)}") from None
    try:
        # --force over an existing file: O_CREAT's mode does not apply to it. Only a regular file:
        # `-o /dev/null --force` as root made /dev/null 0600 for every other user.
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
    except OSError as exc:
        if not force:
            path.unlink(missing_ok=True)  # made here (O_EXCL): no half report left to refuse the next try
        # The output was fine; writing it failed (a full disk): the run failed, status 1.
        raise UserError(f"cannot write {path}: {os_reason(exc)}", exit_code=1) from None
