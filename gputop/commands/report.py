"""`gputop report FILE [-o report.html]`: what happened in a recorded run.

Per-GPU busy and idle time and where the idle time went, the longest idle periods and their
cause, the findings with their evidence, timeline charts. Text on the terminal by default;
``-o x.html`` writes one self-contained page (inline SVG, no scripts), ``-o x.txt`` the text,
``-o x.json`` / ``--json`` the numbers. ``-o -`` is standard output: the text, or with
``--json`` / ``--html`` that format (nothing named ``-`` is written).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from ..errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="summarise a recording: utilisation, idle time and its causes, findings, charts (text or HTML)",
        description="Summarise a recording made by `gputop record`. Prints text; -o FILE.html writes a "
        "self-contained HTML page with charts.",
    )
    p.add_argument("file", metavar="FILE", help="the recording")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write to OUT: .html (default for other names), .txt or .json; - is standard output "
                   "(text, or the format --json/--html picks)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--text", action="store_true", help="print the text report (also when -o is given)")
    shown.add_argument("--json", action="store_true", help="print the numbers as JSON")
    shown.add_argument("--html", action="store_true", help="print the HTML page (e.g. with -o - into a pipe)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite OUT if it exists (never a recording)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..record.reader import Reader
    from ..record.writer import refuse_overwriting_recording
    from ..report import collect, render_html, render_text, summary_dict

    # `-o -` is standard output, as for most tools: never a file named "-".
    out = Path(args.output) if args.output and args.output != "-" else None
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
        print(f"gputop: warning: {summary.damage}", file=sys.stderr)
    width = shutil.get_terminal_size((100, 24)).columns
    if out is not None:
        suffix = out.suffix.lower()
        if suffix == ".json":
            body = json.dumps(summary_dict(summary), indent=2, default=str) + "\n"
        elif suffix == ".txt":
            body = render_text(summary, 100)
        else:
            body = render_html(summary)
        _write(out, body, args.force)
        print(f"gputop: wrote {out}", file=sys.stderr)
    if args.json:
        json.dump(summary_dict(summary), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    elif args.html:
        sys.stdout.write(render_html(summary))
    elif out is None or args.text:
        sys.stdout.write(render_text(summary, min(width, 140)))
    return 0


def _write(path: Path, body: str, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        if force and path.is_symlink():
            path.unlink()
        # 0600, as for recordings: a report holds the job's command line, stack frames and
        # file paths. Share it on purpose (chmod), not by a default that lets every local user read it.
        fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        raise UserError(f"{path} already exists: use --force to overwrite it") from None
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o600)  # --force over an existing file: O_CREAT's mode does not apply to it
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
