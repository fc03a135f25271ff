"""Decode NVML's clocks-event ("throttle") reason bitmask into words a person reads.

Pure: no NVML import. The bit values are NVML's ``nvmlClocksEventReason*`` constants (the same
numbers as the older ``nvmlClocksThrottleReason*`` names, which add the last two bits), so a
mask read by any driver version decodes the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

# nvml.h: nvmlClocksEventReason* / nvmlClocksThrottleReason*
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100
BOARD_LIMIT = 0x200  # throttle-reason only (older name set)
RELIABILITY = 0x400  # throttle-reason only: reliability voltage limit


@dataclass(frozen=True, slots=True)
class Reason:
    bit: int
    word: str  # as shown in a detail view
    short: str  # a compact panel's tag
    limiting: bool  # the clocks are lower than the work would get otherwise


# Order is the order shown: what costs throughput first.
REASONS: tuple[Reason, ...] = (
    Reason(SW_POWER_CAP, "power cap", "pwr", True),
    Reason(HW_POWER_BRAKE_SLOWDOWN, "hw power brake", "brake", True),
    Reason(HW_SLOWDOWN, "hw slowdown", "hw", True),
    Reason(HW_THERMAL_SLOWDOWN, "hw thermal", "hwtherm", True),
    Reason(SW_THERMAL_SLOWDOWN, "sw thermal", "therm", True),
    Reason(BOARD_LIMIT, "board limit", "board", True),
    Reason(RELIABILITY, "reliability limit", "rel", True),
    # A user or admin chose these clocks; lower clocks are deliberate, not a fault.
    Reason(APPLICATIONS_CLOCKS_SETTING, "application clocks setting", "app", False),
    # Clocks held equal across a sync-boost group: a policy, not a limit of this GPU.
    Reason(SYNC_BOOST, "sync boost", "sync", False),
    Reason(DISPLAY_CLOCK_SETTING, "display clocks setting", "disp", False),
    Reason(GPU_IDLE, "gpu idle", "idle", False),
)

KNOWN_MASK = sum(r.bit for r in REASONS)  # bits are distinct, so the sum is the OR

POWER_MASK = SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN | BOARD_LIMIT
THERMAL_MASK = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN
LIMITING_MASK = sum(r.bit for r in REASONS if r.limiting)


def _reasons(mask: int | None, include_idle: bool, limiting_only: bool) -> list[Reason]:
    if not mask:
        return []
    out = []
    for r in REASONS:
        if not mask & r.bit:
            continue
        if r.bit == GPU_IDLE and not include_idle:
            continue
        if limiting_only and not r.limiting:
            continue
        out.append(r)
    return out


def decode_throttle(mask: int | None, include_idle: bool = False, limiting_only: bool = False) -> list[str]:
    """Words for the set bits, most costly first; unknown bits as ``"unknown 0x800"``.

    "gpu idle" is left out unless asked: an idle GPU has low clocks because it has nothing to
    do, which is not news next to a 0 % utilisation.
    """
    words = [r.word for r in _reasons(mask, include_idle, limiting_only)]
    unknown = (mask or 0) & ~KNOWN_MASK
    if unknown and not limiting_only:
        words.append(f"unknown {unknown:#x}")
    return words


def throttle_label(mask: int | None, include_idle: bool = False, sep: str = ",") -> str:
    """Compact form for a narrow panel, e.g. ``"pwr,therm"``; ``""`` when nothing is set."""
    tags = [r.short for r in _reasons(mask, include_idle, False)]
    if (mask or 0) & ~KNOWN_MASK:
        tags.append("?")
    return sep.join(tags)


def is_performance_limiting(mask: int | None) -> bool:
    """True when power, heat or a hardware slowdown holds the clocks down."""
    return bool((mask or 0) & LIMITING_MASK)


def is_power_limited(mask: int | None) -> bool:
    return bool((mask or 0) & POWER_MASK)


def is_thermal_limited(mask: int | None) -> bool:
    return bool((mask or 0) & THERMAL_MASK)


__all__ = [
    "REASONS",
    "Reason",
    "decode_throttle",
    "is_performance_limiting",
    "is_power_limited",
    "is_thermal_limited",
    "throttle_label",
]
