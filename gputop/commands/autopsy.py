"""`gputop autopsy [DIR_OR_PREFIX] [--json]`: after a collective hang, which rank did not join.

Reads the dumps PyTorch's flight recorder wrote when the job's watchdog timed out (one per rank,
``PREFIX<rank>``): the argument names their directory, their prefix or one of them; without
one, the prefix ``TORCH_FR_DUMP_TEMP_FILE`` (else ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``) names in
this shell, else PyTorch's default ``/tmp/nccl_trace_rank_``. Each dump is loaded as plain data
only (no class or function a pickle names is ever resolved: see ``gputop.sources.flight_recorder``)
and put through PyTorch's own analyzer (``torch.distributed.flight_recorder``), so torch must be
importable. Prints the culprit rank, the collective (type, sequence number, process group,
sizes), the ranks that waited, the culprit's last recorded collective with its Python stack, and
what PyTorch's analyzer said; ``--json`` the same for scripts.

Exit status: 0 with a verdict; 2 on bad input (a path that is not there, no dumps where it points,
a file not named as a dump) and without torch, as every command's bad input; 1 when a dump found
cannot be read (cut short, empty, foreign). With ``--json`` an error is also printed as JSON,
``{"error": ..., "exit_status": N}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "autopsy",
        help="after a collective hang: read PyTorch's flight-recorder dumps, name the rank that did not join",
        description="Read the flight-recorder dumps a PyTorch distributed job wrote on a watchdog timeout "
        "(TORCH_FR_BUFFER_SIZE=N with TORCH_NCCL_DUMP_ON_TIMEOUT=1) and say which rank did not join "
        "which collective, where the others waited, and the culprit's last recorded call. Needs torch "
        "importable (PyTorch's own analyzer reads them).",
    )
    p.add_argument("target", nargs="?", metavar="DIR_OR_PREFIX",
                   help="the dumps' directory, their prefix (/tmp/nccl_trace_rank_) or one dump; default: "
                   "$TORCH_FR_DUMP_TEMP_FILE, else $TORCH_NCCL_DEBUG_INFO_TEMP_FILE, else /tmp/nccl_trace_rank_")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UserError as exc:
        if not args.json:
            raise
        # A script reading --json gets JSON either way: the error as one object on standard
        # output (the status still says it failed), the same line on standard error for a human.
        sys.stdout.write(json.dumps({"error": str(exc), "exit_status": exc.exit_code}) + "\n")
        raise


def _plain(target: str | None, message: str) -> str:
    """A named path that is neither there nor a prefix of any dump, said as such: "no dumps at
    /nonexistent<rank>" read as if gputop had looked somewhere odd."""
    from pathlib import Path

    if target and not Path(target).exists() and message.startswith("no flight-recorder dumps at "):
        return (f"{target}: no such file or directory, and no flight-recorder dump is named after it "
                f"({Path(target).name}0, {Path(target).name}1, …)")
    return message


def _run(args: argparse.Namespace) -> int:
    from ..analysis import (
        analyzer_view, autopsy, autopsy_dict, autopsy_text, dump_prefix, dump_problem, rebuild_pg_config,
    )
    from ..sources import AnalyzerUnavailable, DumpError, check_analyzer, find_dumps, load_dump, run_analyzer

    # torch first: without it there is no autopsy, whatever the files.
    try:
        check_analyzer()
    except AnalyzerUnavailable as exc:
        raise UserError(str(exc), exit_code=2) from None
    prefix, named_by = dump_prefix(os.environ)
    try:
        found = find_dumps(args.target, prefix)
    except DumpError as exc:
        # What the argument (or the environment's prefix) names holds no dumps: bad input.
        raise UserError(_plain(args.target, str(exc))) from None
    try:
        dumps = {}
        for rank, path in sorted(found.files.items()):
            try:
                obj = load_dump(path)
            except DumpError as exc:
                if (args.target is not None and os.path.isdir(args.target) and not dumps and "not a pickle" in str(exc)
                        and os.path.basename(found.prefix) != os.path.basename(prefix)):
                    # A directory whose only files merely end in a number (`sums2`: not the dumps'
                    # own prefix) and are not pickles holds no dumps: bad input, as for an empty
                    # one, not a broken dump (exit 1).
                    raise UserError(f"no flight-recorder dumps in {args.target}: {path.name} is named like one "
                                    "but is not a pickle") from None
                raise
            problem = dump_problem(obj)
            if problem:
                raise DumpError(f"{path} is not a flight-recorder dump: {problem}")
            dumps[rank] = obj
        result = None
        fixed, note = rebuild_pg_config(dumps)
        result = run_analyzer(fixed)
    except DumpError as exc:
        raise UserError(_plain(args.target, str(exc)), exit_code=1) from None
    except AnalyzerUnavailable as exc:
        raise UserError(str(exc), exit_code=2) from None
    verdict = autopsy(fixed, analyzer_view(result), notes=(note,) if note else ())
    where = f"{found.prefix}<rank>"
    if args.json:
        source = {"prefix": found.prefix, "named_by": "the argument" if args.target else named_by,
                  "files": {str(r): str(p) for r, p in sorted(found.files.items())}}
        sys.stdout.write(json.dumps(autopsy_dict(verdict, source), indent=2) + "\n")
    else:
        n = len(found.files)
        by = "" if args.target else f", from {named_by}"
        sys.stdout.write(autopsy_text(verdict, f"{n} dump{'s' if n != 1 else ''} at {where}{by}"))
    return 0
