"""A recording's findings judged again by this gputop's advisor.

A report prints the verdict a recording's session showed when the advisor that showed it is this
one (``advisor_fingerprint``: same code, same samples, same verdict). A file written by another
version (or before the fingerprint was kept, or whose findings a cut took) is judged again here,
the way `gputop replay` judges it: the samples fed in time order to one advisor per session,
following that session's target, so the report and the replay agree on the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..advisor import STATE_IDS, Advisor, advisor_fingerprint
from ..model import Event, Finding
from ..record import Reader

# At most this many evaluations over a recording: about 30 ms each, so a report of any length
# judges in well under a minute. A recording longer than this many seconds is judged every
# span / REJUDGE_MAX_EVALS seconds: the verdicts hold in data time, whatever the cadence
# (advisor.engine.Advisor.update), only the times said get coarser.
REJUDGE_MAX_EVALS = 900
STEP_S = 1.0  # one evaluation a second, as `advise` makes them
# What the samples already in a session's first window go back: NVML's buffer, the attach burst.
BACKFILL_S = 3600.0


@dataclass
class Rejudged:
    rows: list[tuple[Finding, float]] = field(default_factory=list)  # (finding, last shown), as finding_rows
    clears: list[Event] = field(default_factory=list)  # "cleared: <title>" when one stops showing
    step_s: float = STEP_S
    recorded: tuple[str, ...] = ()  # the ids the file's own findings held (state ids left out)


def needs_rejudging(reader: Reader) -> bool:
    """Whether the file's findings are another advisor's (or none to read): every session not
    stamped with this advisor's fingerprint, or findings a cut took."""
    if "findings" in reader.lost_tables:
        return True
    stamps = reader.advisor_fingerprints()
    now = advisor_fingerprint()
    ids = [s.get("id") for s in reader.sessions] or [None]
    return any(stamps.get(i) != now for i in ids)


def rejudge(reader: Reader, max_evals: int = REJUDGE_MAX_EVALS) -> Rejudged:
    from ..store import Store

    start, end = reader.start_ts, reader.end_ts
    sessions = reader.session_list() or [{"start": start, "end": end, "target_pid": None}]
    # Each session over its own span (an appended one may start days after the last ended): the
    # evaluations spread over the time that holds samples, not the gaps between sessions.
    spans = [(x["start"], min(x["end"], sessions[k + 1]["start"]) if k + 1 < len(sessions) else max(x["end"], end))
             for k, x in enumerate(sessions)]
    watched = sum(max(0.0, b - a) for a, b in spans)
    out = Rejudged(step_s=max(STEP_S, watched / max(1, max_evals)))
    out.recorded = tuple(dict.fromkeys(f.id for f, _ in reader.finding_rows() if f.id not in STATE_IDS))
    for sess, (s0, s1) in zip(sessions, spans):
        store = Store()
        advisor = Advisor(target_pid=sess["target_pid"])
        store.add(reader.samples(s0 - BACKFILL_S, s0))
        shown: dict[str, Finding] = {}
        t = s0
        while t < s1:
            nxt = min(s1, t + out.step_s)
            store.add(reader.samples(t, nxt))
            t = nxt
            now = {f.id: f for f in advisor.evaluate(store, now=t) if f.id not in STATE_IDS}
            for fid, f in now.items():
                out.rows.append((f, t))
            for fid, f in shown.items():
                if fid not in now:
                    out.clears.append(Event(ts=t, source="advisor", message=f"cleared: {f.title}"))
            shown = now
    return out
