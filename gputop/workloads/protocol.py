"""The progress lines a workload prints on stdout, and their parser.

One line per event, ``gputop-workload KIND key=value ...``, so the demo command, the harness and
the tests read steps/s without guessing:

    gputop-workload ready scenario=healthy device=cuda pid=1234
    gputop-workload rate t=1700000000.123 steps=420 steps_per_s=431.2
    gputop-workload done scenario=healthy steps=6500 seconds=15.02 steps_per_s=432.8 reason=duration

Values never contain spaces. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFIX = "gputop-workload"

READY = "ready"
RATE = "rate"
DONE = "done"
NOTE = "note"
KINDS = (READY, RATE, DONE, NOTE)


@dataclass(frozen=True, slots=True)
class Line:
    kind: str
    fields: dict[str, str] = field(default_factory=dict)

    def num(self, key: str, default: float | None = None) -> float | None:
        """A field as a float, ``default`` when absent or not a number."""
        try:
            return float(self.fields[key])
        except (KeyError, ValueError):
            return default


def format_line(kind: str, **fields: object) -> str:
    parts = [PREFIX, kind]
    for key, value in fields.items():
        if isinstance(value, float):
            text = f"{value:.6g}" if key != "t" else f"{value:.3f}"
        else:
            text = str(value)
        parts.append(f"{key}={text.replace(' ', '_')}")
    return " ".join(parts)


def parse_line(text: str) -> Line | None:
    """The progress line in ``text``, or ``None`` when it is any other output."""
    parts = text.strip().split()
    if len(parts) < 2 or parts[0] != PREFIX or parts[1] not in KINDS:
        return None
    fields: dict[str, str] = {}
    for part in parts[2:]:
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    return Line(parts[1], fields)
