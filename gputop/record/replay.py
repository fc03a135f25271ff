"""Replay a recording: a Source whose samples come from a file at a chosen pace.

It emits exactly what the live sources emitted, with their original timestamps, so the store,
the analysis and the UI cannot tell a replay from a live session. A virtual clock (the replay
*position*) advances at ``speed`` times wall time while playing; each poll emits the samples
recorded between the last position and the new one.

Jumps (seek, a step back, a jump far ahead) rebuild the store: it is reset and refilled, in one
batch, with the state at the new position (static info then, and the last minutes of every
series, see ``HistoryWindows``). When attached to a pipeline (``attach``), the source publishes
its batches itself, under the same lock a seek takes, so a batch read before a seek can never
land in the store after it.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..model import Event, Reset
from ..units import DURATION_UNITS, fmt_clock
from .navigate import FindingMark, IdlePeriod, Navigator
from .reader import Reader

# Replay speeds offered by the UI's faster/slower keys.
SPEEDS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# How often the pipeline polls: ten frames a second makes 1x and 60x both look smooth.
POLL_INTERVAL_S = 0.1
# A move forward by more than this is not played through sample by sample: the store is rebuilt
# at the new position instead (at 3600x a poll covers six minutes; feeding every stack sample of
# them would cost more than the rebuild).
MAX_INCREMENT_S = 30.0


@dataclass(frozen=True)
class HistoryWindows:
    """How far back a seek re-reads each series, in seconds (events/findings: a count).

    GPU charts show the last 2 min by default (longer chart windows fill in as the replay plays
    on, as they do live); the advisor reads the last minute of everything, and its stuck check
    stacks up to ``stuck_after`` (30 s) + 60 s back; host and process panes show the latest
    sample. Each second here is time a seek spends, so no series reaches further than its panes.
    """

    gpu: float = 300.0
    util: float = 300.0
    gpu_processes: float = 5.0
    host: float = 60.0
    procs: float = 60.0
    stacks: float = 90.0
    tasks: float = 90.0  # the stuck check reads the main threads' /proc readings as far back as their stacks
    events: int = 500
    findings: int = 500


class ReplaySource:
    name = "replay"

    def __init__(
        self,
        reader: "Reader",
        navigator: "Navigator | None" = None,
        speed: float = 1.0,
        start: float | None = None,
        interval: float = POLL_INTERVAL_S,
        history: HistoryWindows = HistoryWindows(),
        paused: bool = False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.navigator = navigator  # idle periods and findings for jumps and the timeline
        self.interval = interval
        self.history = history
        self._mono = monotonic
        self._lock = threading.RLock()
        self._publish: Callable[[Sequence[object]], None] | None = None
        self._speed = _valid_speed(speed)
        self._playing = not paused
        self.at_end = False
        self._emitted: float | None = None  # position up to which samples went out
        self._damage_said = False  # a damaged file's note went out with the first frame
        first = reader.first_poll_ts()
        self._pos = self._clamp(first if start is None else start)
        self._anchor = monotonic()

    # ----------------------------------------------------------------- wiring

    def attach(self, publish: Callable[[Sequence[object]], None]) -> None:
        """Publish batches through ``publish`` (the pipeline's) instead of returning them."""
        self._publish = publish

    @property
    def start_ts(self) -> float:
        return self.reader.start_ts

    @property
    def end_ts(self) -> float:
        return self.reader.end_ts

    @property
    def damage(self) -> str | None:
        return self.reader.damage

    # ----------------------------------------------------------------- the clock

    @property
    def position(self) -> float:
        with self._lock:
            if not self._playing:
                return self._pos
            return self._clamp(self._pos + (self._mono() - self._anchor) * self._speed)

    @property
    def playing(self) -> bool:
        return self._playing

    @property
    def speed(self) -> float:
        return self._speed

    def _clamp(self, t: float) -> float:
        return min(self.end_ts, max(self.start_ts, t))

    def _rebase(self) -> None:
        self._pos = self.position
        self._anchor = self._mono()

    # ----------------------------------------------------------------- Source

    def poll(self) -> list[object]:
        with self._lock:
            batch = self._advance(self.position)
            return self._out(batch)

    def close(self) -> None:
        try:
            self.reader.close()
        except Exception:
            pass

    def _out(self, batch: list[object]) -> list[object]:
        if self._publish is not None and batch:
            self._publish(batch)
            return []
        return batch

    def _advance(self, target: float) -> list[object]:
        emitted = self._emitted
        if emitted is None or target < emitted or target - emitted > MAX_INCREMENT_S:
            batch = self._rebuild(target)
        elif target > emitted:
            batch = self.reader.samples(emitted, target)
            self._emitted = target
        else:
            batch = []
        if self._playing and target >= self.end_ts and not self.at_end:
            self._pos, self._playing, self.at_end = self.end_ts, False, True
            batch.append(Event(self.end_ts, "replay", "end of recording"))
        return batch

    def _rebuild(self, target: float) -> list[object]:
        # The marker first: the store forgets what it held, then takes the state at ``target``.
        batch = [Reset(target), *self.reader.history(target, self.history)]
        first = self._emitted is None and not self._damage_said
        self._emitted = target
        # A damaged file says so as it opens (what the cut took: a panel without samples is then
        # explained, not "waiting"), and again where its readable data ends.
        if self.reader.damage and (first or target >= self.end_ts - 1.0):
            self._damage_said = True
            batch.append(Event(target, "replay", self.reader.damage, "warning"))
        return batch

    # ----------------------------------------------------------------- controls

    def goto(self, text: str) -> None:
        """Seek to a position the user typed (+90s, -5m, 14:03, 50%...); ValueError if it is not one."""
        self.seek(parse_position(text, self.start_ts, self.end_ts))

    def play(self) -> None:
        with self._lock:
            if self.at_end:
                self._seek_locked(self.start_ts)
            self._anchor = self._mono()
            self._playing = True
            self.at_end = False

    def pause(self) -> None:
        with self._lock:
            self._rebase()
            self._playing = False

    def toggle_pause(self) -> None:
        if self._playing:
            self.pause()
        else:
            self.play()

    def set_speed(self, speed: float) -> None:
        with self._lock:
            self._rebase()
            self._speed = _valid_speed(speed)

    def faster(self) -> float:
        self.set_speed(next((s for s in SPEEDS if s > self._speed + 1e-9), SPEEDS[-1]))
        return self._speed

    def slower(self) -> float:
        self.set_speed(next((s for s in reversed(SPEEDS) if s < self._speed - 1e-9), SPEEDS[0]))
        return self._speed

    def step(self, seconds: float) -> None:
        """Move by ``seconds`` (negative: back) and show the result at once."""
        with self._lock:
            self._seek_locked(self.position + seconds, rebuild=seconds < 0)

    def seek(self, ts: float) -> None:
        """Show the state at ``ts`` (clamped to the recording)."""
        with self._lock:
            self._seek_locked(ts, rebuild=True)

    def seek_fraction(self, f: float) -> None:
        self.seek(self.start_ts + max(0.0, min(1.0, f)) * (self.end_ts - self.start_ts))

    def _seek_locked(self, ts: float, rebuild: bool = True) -> None:
        ts = self._clamp(ts)
        self._pos, self._anchor = ts, self._mono()
        self.at_end = False
        if rebuild:
            self._emitted = None
        if self._publish is not None:
            self._out(self._advance(ts))

    # ----------------------------------------------------------------- the timeline

    def overview(self) -> list:
        return self.navigator.overview() if self.navigator is not None else []

    def idle_periods(self) -> "list[IdlePeriod]":
        return self.navigator.idle_periods() if self.navigator is not None else []

    def finding_marks(self) -> "list[FindingMark]":
        return self.navigator.finding_marks() if self.navigator is not None else []

    def next_idle(self, after: float | None = None) -> float | None:
        """Start of the next idle period (the reader's periods are the analysis's own runs)."""
        after = self.position if after is None else after
        return next((p.start for p in self.idle_periods() if p.start > after + 0.5), None)

    def prev_idle(self, before: float | None = None) -> float | None:
        before = self.position if before is None else before
        return next((p.start for p in reversed(self.idle_periods()) if p.start < before - 1.0), None)

    def next_finding(self, after: float | None = None) -> float | None:
        after = self.position if after is None else after
        return next((m.ts for m in self.finding_marks() if m.ts > after + 0.5), None)

    def prev_finding(self, before: float | None = None) -> float | None:
        before = self.position if before is None else before
        return next((m.ts for m in reversed(self.finding_marks()) if m.ts < before - 0.5), None)

    def jump(self, ts: float | None) -> bool:
        if ts is None:
            return False
        self.seek(ts)
        return True

    def status(self) -> dict[str, object]:
        return {
            "position": self.position,
            "start": self.start_ts,
            "end": self.end_ts,
            "speed": self._speed,
            "playing": self._playing,
            "at_end": self.at_end,
            "damage": self.reader.damage,
        }


def _valid_speed(speed: float) -> float:
    if not speed == speed or speed <= 0:
        raise ValueError(f"speed must be greater than 0: {speed!r}")
    return min(float(speed), 1e6)


# --------------------------------------------------------------------------- positions as text

def _offset(text: str) -> float | None:
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", text)
    if parts and not re.sub(r"(\d+(?:\.\d+)?)\s*([smhd])", "", text).strip():
        return sum(float(n) * DURATION_UNITS[u] for n, u in parts)
    try:
        return float(text)
    except ValueError:
        return None


def parse_position(text: str, start: float, end: float) -> float:
    """A place in a recording, as a user types it. Raises ValueError with a one-line reason.

    ``+90s`` / ``+1h30m`` / ``90`` (from the start), ``-5m`` (before the end), ``50%``,
    ``14:03`` or ``14:03:30`` (local clock time within the recording; the first match),
    ``2026-11-22 14:03[:30]`` or ``2026-11-22T14:03``.
    """
    t = text.strip().lower()
    if not t:
        raise ValueError(f"not a time: {text!r} (try +90s, 14:03, 2026-11-22 14:03 or 50%)")
    if t.endswith("%"):
        try:
            f = float(t[:-1])
        except ValueError:
            raise ValueError(f"not a percentage: {text!r}") from None
        if not 0 <= f <= 100:
            raise ValueError(f"must be 0% to 100%: {text!r}")
        return start + f / 100.0 * (end - start)
    if t[0] in "+-" and ":" not in t:
        off = _offset(t[1:])
        if off is None:
            raise ValueError(f"not a time offset: {text!r} (try +90s or +1h30m)")
        return start + off if t[0] == "+" else end - off
    if re.fullmatch(r"\d+(?:\.\d+)?|(\d+(?:\.\d+)?\s*[smhd]\s*)+", t):
        off = _offset(t)
        if off is not None:
            return start + off
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})[t ](\d{1,2}):(\d{2})(?::(\d{2}(?:\.\d+)?))?", t)
    if m:
        try:
            base = time.mktime(time.strptime(f"{m.group(1)} {m.group(2)}:{m.group(3)}", "%Y-%m-%d %H:%M"))
        except (ValueError, OverflowError):
            raise ValueError(f"not a date and time: {text!r}") from None
        return base + float(m.group(4) or 0)
    m = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}(?:\.\d+)?))?", t)
    if m:
        h, mi, sec = int(m.group(1)), int(m.group(2)), float(m.group(3) or 0)
        if h > 23 or mi > 59 or sec >= 60:
            raise ValueError(f"not a clock time: {text!r} (00:00 to 23:59:59)")
        for k in range(0, int((end - start) // 86400) + 2):
            lt = time.localtime(start + k * 86400)
            cand = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, h, mi, 0, 0, 0, -1)) + sec
            if start - 1 <= cand <= end + 1:
                return cand
        raise ValueError(f"not within the recording: {text!r} ({fmt_clock(start)} to {fmt_clock(end)})")
    raise ValueError(f"not a time: {text!r} (try +90s, 14:03, 2026-11-22 14:03 or 50%)")
