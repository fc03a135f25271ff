"""How busy the host's CPUs are, as the stack sampler needs to know it: whether a task that wants
a CPU has to wait for one.

On a saturated host a blocking py-spy dump stops every thread of the job and then waits its turn
for a CPU, the job stopped all the while (on a 2-core machine at load 4-8 a dump's 10 ms of CPU
took hundreds of ms of wall time); so the sampler takes no blocking dump then, and says why it
samples less. The kernel's pressure stall information (``/proc/pressure/cpu``: the share of time
some runnable task waited) says it directly; where the kernel has none, the load average against
the CPUs this process may use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

LOADAVG_FILE = "/proc/loadavg"
PRESSURE_FILE = "/proc/pressure/cpu"
# Saturated: runnable tasks waited for a CPU this share of the last 10 s, or (no pressure
# information) the 1-minute load reaches the number of CPUs. Judgement: at a fifth of the time
# waiting, a process that starts now (py-spy) is likely to wait for its CPU too.
PRESSURE_SATURATED_PCT = 20.0
LOAD_SATURATED_PER_CPU = 1.0
# Spare: at least this many CPUs idle by the 1-minute load, and (where the kernel says) runnable
# tasks waited for a CPU under SPARE_PRESSURE_PCT of the last 10 s. A nonblocking py-spy dump
# stops no thread of the job and runs on a CPU the job does not use, so on such a host sampling
# more often takes nothing from the job. Judgement: two, one for py-spy and one for the job's
# bursts (DataLoader workers waking together); and a twentieth of the time waiting is a host
# where a CPU is free nearly whenever one is wanted.
SPARE_CPUS = 2.0
SPARE_PRESSURE_PCT = 5.0


@dataclass(frozen=True)
class HostCpu:
    """One reading of the host's CPU contention."""

    cpus: int  # the CPUs this process may run on
    load1: float | None = None  # the 1-minute load average
    pressure_pct: float | None = None  # % of the last 10 s some runnable task waited for a CPU

    @property
    def saturated(self) -> bool:
        if self.pressure_pct is not None:
            return self.pressure_pct >= PRESSURE_SATURATED_PCT
        return self.load1 is not None and self.load1 >= LOAD_SATURATED_PER_CPU * self.cpus

    @property
    def spare(self) -> bool:
        """CPUs to spare (SPARE_CPUS): the sampler may spend more of its own there. Unknown load:
        not spare."""
        if self.load1 is None or self.cpus - self.load1 < SPARE_CPUS:
            return False
        return self.pressure_pct is None or self.pressure_pct < SPARE_PRESSURE_PCT


def parse_loadavg(text: str) -> float | None:
    """The 1-minute load from /proc/loadavg's text."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def parse_pressure(text: str) -> float | None:
    """``some avg10`` from /proc/pressure/cpu's text: the share of time some task waited, in %."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for f in fields[1:]:
                if f.startswith("avg10="):
                    try:
                        return float(f[len("avg10="):])
                    except ValueError:
                        return None
    return None


def read_host_cpu() -> HostCpu:
    def read(path: str) -> str | None:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    load = read(LOADAVG_FILE)
    pressure = read(PRESSURE_FILE)
    return HostCpu(cpus=max(1, cpus), load1=parse_loadavg(load) if load else None,
                   pressure_pct=parse_pressure(pressure) if pressure else None)


__all__ = ["HostCpu", "PRESSURE_SATURATED_PCT", "SPARE_CPUS", "SPARE_PRESSURE_PCT", "parse_loadavg", "parse_pressure", "read_host_cpu"]
