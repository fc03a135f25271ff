"""A recording's findings judged again by this gputop's advisor.

A report prints the verdict a recording's session showed when the advisor that showed it is this
one (``advisor_fingerprint``: same code, same samples, same verdict). A file written by another
version (or before the fingerprint was kept, or whose findings a cut took) is judged again here,
the way `gputop replay` judges it: the samples fed in time order to one advisor per session,
following that session's target, so the report and the replay agree on the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

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


def session_spans_judged(reader: Reader) -> list[tuple[dict, float, float]]:
    """Each recording session with the span its samples cover: (session, start, end). An appended
    session may start days after the last ended: each is judged over its own span, not the gap."""
    start, end = reader.start_ts, reader.end_ts
    sessions = reader.session_list() or [{"start": start, "end": end, "target_pid": None}]
    return [(x, x["start"], min(x["end"], sessions[k + 1]["start"]) if k + 1 < len(sessions) else max(x["end"], end))
            for k, x in enumerate(sessions)]


def judged(reader: Reader, step_s: float = STEP_S,
           spans: list[tuple[dict, float, float]] | None = None) -> Iterator[tuple[float, list[Finding], Advisor]]:
    """The advisor over a recording as `advise` runs it live: each session's samples fed in time
    order to one advisor following that session's target, an evaluation every ``step_s`` and the
    last at the session's end (never past it, where the job would read as standing still).
    Yields (time, the findings shown then, the advisor). Replay's way, shared by the report, the
    bench's replays and the tests'."""
    from ..store import Store

    judging = reader.judging()
    ids = [s["id"] for s in reader.sessions]  # session_list's ``session`` is the ordinal of these
    for sess, s0, s1 in spans if spans is not None else session_spans_judged(reader):
        store = Store()
        # With the session's own threshold and window: the verdict it showed live.
        n = sess.get("session")
        settings = judging.get(ids[n - 1], {}) if isinstance(n, int) and 0 < n <= len(ids) else {}
        advisor = Advisor(target_pid=sess["target_pid"], **{f"{k}_s": v for k, v in settings.items()})
        store.add(reader.samples(s0 - BACKFILL_S, s0))  # what the sources read at attach (NVML's buffer)
        t = s0
        while t < s1:
            nxt = min(s1, t + step_s)
            store.add(reader.samples(t, nxt))
            t = nxt
            yield t, advisor.evaluate(store, now=t), advisor


def rejudge(reader: Reader, max_evals: int = REJUDGE_MAX_EVALS) -> Rejudged:
    spans = session_spans_judged(reader)
    watched = sum(max(0.0, b - a) for _, a, b in spans)
    out = Rejudged(step_s=max(STEP_S, watched / max(1, max_evals)))
    out.recorded = tuple(dict.fromkeys(f.id for f, _ in reader.finding_rows() if f.id not in STATE_IDS))
    shown: dict[str, Finding] = {}
    last: Advisor | None = None
    for t, found, advisor in judged(reader, out.step_s, spans):
        if advisor is not last:
            shown, last = {}, advisor  # a new session: nothing shown yet
        now = {f.id: f for f in found if f.id not in STATE_IDS}
        out.rows.extend((f, t) for f in now.values())
        out.clears.extend(Event(ts=t, source="advisor", message=f"cleared: {f.title}")
                          for fid, f in shown.items() if fid not in now)
        shown = now
    return out
