"""Which advisor reached a verdict: a digest of the code that judges.

A recording keeps the findings its session's advisor showed. Read later by another version of
gputop (rules added, thresholds moved), those findings and a replay of the same samples disagree,
and a report printing the stored ones gives an older verdict as today's. The digest covers the
modules that judge (``advisor`` and ``analysis``): equal digests mean the same code would reach
the same verdict on the same samples, so the stored findings stand; otherwise they are judged
again (``report.rejudge``).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

# The packages whose code decides a verdict: the rules and the evidence they read.
JUDGING_PACKAGES = ("advisor", "analysis")
DIGEST_CHARS = 16


@functools.lru_cache(maxsize=1)
def advisor_fingerprint() -> str:
    """A digest of the judging modules' sources, the same for the same code wherever installed."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in JUDGING_PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(b"\0")
            h.update(f.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:DIGEST_CHARS]
