"""`gputop info FILE`: what a recording holds, without replaying it.

Host, driver, GPUs, time span, size (and bytes per GPU-hour), the recorded target, sample
counts per series, findings, and whether the file is damaged. ``--check`` also decodes every
block; ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..units import fmt_length, fmt_size, fmt_time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="show what a recording holds (host, GPUs, time span, size, target)",
        description="Describe a gputop recording: host, driver, GPUs, time span, size, the recorded "
        "target and how many samples of each kind it holds.",
    )
    p.add_argument("file", metavar="FILE", help="a recording made by `gputop record` or `gputop --record`")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--check", action="store_true", help="also decode every block and report damage")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..record import Navigator
    from ..record import Reader
    from ..report.rejudge import needs_rejudging

    with Reader(args.file) as r:
        nav = Navigator(r)
        d = r.describe()
        d["findings"] = len({(m.finding_id, m.gpu) for m in nav.finding_marks()})
        d["findings_lost"] = r.lost("findings") is not None  # a cut copy: the count is what survived
        d["stacks_lost"] = r.lost("stacks")  # "lost", "partly" or None: the stack count is what can be read
        # The same for every other count: "0 /proc" or "0 process" for a table the cut took read as
        # none recorded. Process samples cannot be read without their processes' rows either.
        d["lost"] = {t: r.lost(t) for t in ("gpu_samples", "util_points", "host_samples", "proc_samples",
                                            "task_samples", "events")}
        if r.lost("processes") == "lost":
            d["lost"]["proc_samples"] = "lost"
        elif d["lost"]["proc_samples"] is None and r.lost("processes"):
            d["lost"]["proc_samples"] = "partly"
        # Another advisor's findings (or none stamped): what a report or replay of it says is judged again.
        d["findings_other_advisor"] = not d["findings_lost"] and needs_rejudging(r)
        d["idle_periods"] = len(nav.idle_periods())
        if args.check:
            d["bad_blocks"] = r.check_blocks()
            d["bad_rows"] = r.bad_rows
            d["damage"] = r.damage
    if args.json:
        json.dump(d, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(format_info(d))
    bad = d.get("damage") or d.get("bad_blocks")
    return 1 if args.check and bad else 0


def _rate_text(d: dict) -> str:
    """'  (0.7 MB per GPU-hour)', or why there is none: a short recording is mostly its fixed
    start, and a rate extrapolated from it would be tens of times too high."""
    if d.get("bytes_per_gpu_hour"):
        return f"  ({fmt_size(d['bytes_per_gpu_hour'])} per GPU-hour)"
    least = d.get("rate_min_s")
    if d.get("gpu_indices") and least and (d.get("duration_s") or 0.0) < least:
        return (f"  in {fmt_length(d.get('duration_s') or 0.0)}: too short to estimate the size per GPU-hour "
                f"(that takes at least {least / 60:.0f} min)")
    return ""


def _session_text(x: dict) -> str:
    """'<start> → <end>  (0:00:22)  PID 26624  python healthy.py' (or 'no target (no --pid)')."""
    who = (f"PID {x['target_pid'] or '?'}  {x['target_cmdline'] or ''}".rstrip()
           if x["target_pid"] or x["target_cmdline"] else "no target (no --pid)")
    closed = "" if x.get("closed", True) else "  [not closed cleanly]"
    return f"{fmt_time(x['start'])} → {fmt_time(x['end'])}  ({fmt_length(x['duration_s'])})  {who}{closed}"


# How much of the stack samples a cut left readable (Reader.lost), beside their count.
_STACKS_CUT = {"lost": " (lost in the cut)", "partly": " (part of them or their frames lost in the cut)"}

# Any other count beside what a cut took of it (Reader.lost).
_CUT = {"lost": " (lost in the cut)", "partly": " (part of them lost in the cut)"}


def format_info(d: dict) -> str:
    from ..record import LOST_FINDINGS, backfill_note

    note = backfill_note(d.get("backfill_s") or 0.0)
    lines = [
        f"file        {d['path']}",
        f"format      gputop recording, schema {d['schema_version']}, written by {d['created_by'] or '?'}",
    ]
    cpu_only = not d["gpus"] and not d["gpu_indices"] and not d["driver"]
    if cpu_only:
        # No GPU was seen: "driver ?  CUDA ?" would read as details lost, not as none there.
        lines.append(f"host        {d['host'] or '?'}  CPU only (no NVIDIA GPU or driver seen)")
    else:
        lines.append(f"host        {d['host'] or '?'}  driver {d['driver'] or '?'}  CUDA {d['cuda'] or '?'}"
                     + ("  [fake GPU source]" if d.get("source") == "fake" else ""))
    if d["gpus"]:
        for g in d["gpus"]:
            mem = f", {g['memory_total'] / 1024**3:.0f} GiB" if g.get("memory_total") else ""
            lines.append(f"gpu {g['index']:<7} {g['name']}{mem}")
    elif not cpu_only:
        lines.append(f"gpus        {len(d['gpu_indices'])} (no device details recorded)")
    lines += [
        f"span        {fmt_time(d['start'])} → {fmt_time(d['end'])}  ({fmt_length(d['duration_s'] or 0.0)}{'; ' + note if note else ''})",
        f"size        {fmt_size(d['size_bytes'])}" + _rate_text(d),
    ]
    sessions = d.get("session_list") or []
    targets = {(x["target_pid"], x["target_cmdline"]) for x in sessions}
    if (d.get("target_pid") or d.get("target_cmdline")) and len(targets) <= 1:
        lines.append(f"target      PID {d.get('target_pid') or '?'}  {d.get('target_cmdline') or ''}".rstrip())
    if d.get("sessions", 1) > 1:
        # Appended sessions may follow other processes: each one's span and target, so that none
        # is read as the last one's.
        more = f", {len(targets)} targets" if len(targets) > 1 else ""
        lines.append(f"sessions    {d['sessions']} (appended){more}")
        for x in sessions:
            lines.append(f"{'session ' + str(x['session']):<12}{_session_text(x)}")
    c = d.get("counts") or {}
    if c:
        lines.append(
            "samples     "
            + ", ".join(
                f"{c.get(k, 0):,} {label}"
                + (_STACKS_CUT.get(d.get("stacks_lost"), "") if k == "stack_samples"
                   else _CUT.get((d.get("lost") or {}).get(k), ""))
                for k, label in (
                    ("gpu_samples", "GPU polls"),
                    ("util_points", "utilisation points"),
                    ("host_samples", "host"),
                    ("proc_samples", "process"),
                    ("stack_samples", "stack"),
                    ("task_samples", "/proc"),
                    ("events", "events"),
                )
                if k != "task_samples" or k in c  # a file from before them has none to count
            )
        )
    found = d.get("findings", 0)
    if d.get("findings_lost"):
        found = f"{found} (more may have been lost in the cut)" if found else LOST_FINDINGS
    elif d.get("findings_other_advisor"):
        found = f"{found} (shown by another version of gputop's advisor: a report or replay judges the samples again)"
    lines.append(f"findings    {found}   idle periods {d.get('idle_periods', 0)}")
    if "bad_blocks" in d:
        lines.append(f"check       {d['bad_blocks']} unreadable block(s), {d.get('bad_rows', 0)} bad row(s)")
    if d.get("state") == "not closed cleanly":
        lines.append("state       not closed cleanly (the recorder was killed or the disk filled); "
                     "everything it committed is here")
    elif d.get("state") == "recording":
        lines.append("state       being recorded now")
    if d.get("damage"):
        lines.append(f"DAMAGED     {d['damage']}")
    return "\n".join(lines)
