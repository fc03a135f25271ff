#!/usr/bin/env python3
"""The advisor, as it is now, over recordings a bench kept (``--record-dir``): what `advise`
would have said of the same evidence, second by second.

A live run's verdict is the advisor of that day on that day's job; once a miss is understood and
the rules change, the job's recording is replayed through the new advisor to see the change's
effect on the same data (the job is then in-sample: it is reported apart from held-out runs).

    python bench/replay_advise.py DIR_OR_FILES... [--truths multi_rank] [--json OUT]

Per recording: the findings shown at the end (with evidence and action, as `advise --json`
gives them), when each was first shown (seconds from the recording's start, which is the
attach), and the top finding over time. With ``--truths multi_rank`` each recording named after a
held-out multi-rank job is scored by that bench's own scorer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

STEP_S = 1.0  # one evaluation a second, as `advise` makes them


def replay(path: Path) -> dict:
    """The advisor over ``path``, one evaluation per STEP_S of recorded time, fed only what was
    recorded up to each instant."""
    from gputop.record import Reader
    from gputop.report.rejudge import judged

    reader = Reader(path)
    try:
        t0 = t = reader.start_ts
        seen: dict[str, float] = {}
        timeline: list[dict] = []
        shown = []
        for t, shown, _ in judged(reader, STEP_S):
            for f in shown:
                seen.setdefault(f.id, round(t - t0, 1))
            top = shown[0] if shown else None
            now_top = {"top": top.id if top else None, "severity": top.severity.value if top else None}
            # A change of severity is a change of what is shown, as `advise --json` logs it.
            if not timeline or {k: timeline[-1][k] for k in now_top} != now_top:
                timeline.append({"t_s": round(t - t0, 1), **now_top})
    finally:
        reader.close()
    return {
        "recording": path.name,
        "duration_s": round(t - t0, 1),
        "findings": [{"id": f.id, "title": f.title, "severity": f.severity.value, "evidence": list(f.evidence),
                      "action": f.action} for f in shown],
        "seen": [{"id": k, "first_seen_s": v} for k, v in seen.items()],
        "top_timeline": timeline,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="recordings, or folders of them")
    ap.add_argument("--truths", choices=("multi_rank",), help="score each recording by that bench's held-out truths")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--md", type=Path, help="write a table of the top finding over time here")
    args = ap.parse_args(argv)
    files = sorted(f for p in args.paths for f in ([p] if p.is_file() else p.glob("*.gputop")))
    if not files:
        print("no recordings", file=sys.stderr)
        return 2
    truths = {}
    if args.truths == "multi_rank":
        import multi_rank

        truths = multi_rank.fresh_truths()
    rows = []
    for f in files:
        r = replay(f)
        mode = f.stem
        if mode in truths:
            import multi_rank

            truth = truths[mode]
            ok, first, title = multi_rank.fresh_right(truth, r)
            want = multi_rank.wanted_finding(truth) or next(
                (x["id"] for x in r["findings"] if ok and x["title"] == title), None)
            r.update(mode=mode, correct=ok, t_correct_s=first if ok else None, title=title,
                     false_warning_ids=multi_rank.false_warnings(r, want))
        rows.append(r)
        said = r.get("title") or (r["findings"][0]["title"] if r["findings"] else "(nothing)")
        print(f"{f.name}: {'right' if r.get('correct') else 'wrong' if 'correct' in r else '-'} "
              f"t={r.get('t_correct_s')} false={r.get('false_warning_ids', [])} :: {said}")
    if args.json:
        args.json.write_text(json.dumps({"step_s": STEP_S, "results": rows}, indent=2) + "\n")
    if args.md:
        args.md.write_text(markdown(rows))
    return 0


def markdown(rows: list[dict]) -> str:
    """The top finding over time per recording, as a table: what the advisor as it is now shows,
    second by second, on each recording's evidence."""
    out = ["# The advisor as it is now over recorded sessions", "",
           f"`python bench/replay_advise.py FILES --md OUT`: each recording replayed through today's advisor, one "
           f"evaluation every {STEP_S:g} s of recorded time, fed only what was recorded up to each instant. The "
           "top finding shown over time (its severity), and the findings shown at the end. In-sample: these "
           "recordings have been read while building the rules.", "",
           "| recording | s | top finding over time | shown at the end |", "|---|---|---|---|"]
    for r in rows:
        timeline = " → ".join(f"{t['t_s']:g} s: {t['top'] or '(none)'}" + (f" ({t['severity']})" if t["top"] else "")
                              for t in r["top_timeline"])
        end = ", ".join(f"{f['id']} ({f['severity']})" for f in r["findings"]) or "(none)"
        out.append(f"| {r['recording']} | {r['duration_s']:g} | {timeline} | {end} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
