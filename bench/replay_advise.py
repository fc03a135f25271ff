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
    return 0


if __name__ == "__main__":
    sys.exit(main())
