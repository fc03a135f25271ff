"""NCCL's RAS status report, asked for at scrape time on behalf of the attached ranks, with a
bounded cost: at most one query per scrape, each ending within ``QUERY_TIMEOUT_S``; a service
that does not answer is asked again only after ``BACKOFF_S`` and says nothing (no series, no
log line); no thread is started (addresses that would need the resolver are not asked).

Which service: the one each rank's environment names (``NCCL_RAS_ADDR``, else NCCL's default
``localhost:28028``; none where ``NCCL_RAS_ENABLE`` turns it off), read once per process and
only those two keys. Every process of an NCCL 2.24+ job runs the service and any of them answers
for the whole job, so one address usually serves every rank of a host; where the ranks name
several, the scrapes take them in turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ipaddress
import time
from typing import Callable, Iterable, Mapping

# A scrape waits at most this long for the report. A healthy job's RAS thread answers in a few
# milliseconds on loopback (NCCL's own "Communicators... (0.000s)"); 200 ms bounds a scrape's
# delay while leaving room for a busy host.
QUERY_TIMEOUT_S = 0.2
# A service that does not answer (no NCCL job, NCCL older than 2.24, RAS off, not started yet)
# is asked again this much later: one refused connection per half-minute.
BACKOFF_S = 30.0
# Different addresses followed at once (each rank's environment could name its own).
MAX_ADDRS = 8
# This host's addresses are read again this often (the report names a rank's node by address).
NODES_EVERY_S = 60.0
_KEYS = ("NCCL_RAS_ADDR", "NCCL_RAS_ENABLE")


def asks_no_resolver(addr: str) -> bool:
    """``host:port`` whose host is a numeric address or ``localhost`` (which the query tries as
    127.0.0.1 and ::1): the query then needs no resolver thread that could outlive it."""
    host = addr.rsplit(":", 1)[0].strip("[]").split("%", 1)[0]
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def local_addresses() -> frozenset[str] | None:
    """This host's interface addresses (None when they cannot be read)."""
    try:
        import psutil

        return frozenset(a.address.split("%", 1)[0] for addrs in psutil.net_if_addrs().values() for a in addrs
                         if a.address)
    except Exception:  # no psutil support on this platform: a pid alone identifies
        return None


def _environ(pid: int) -> Mapping[str, str]:
    from ..sources import environ_of

    return environ_of(pid)


if TYPE_CHECKING:
    from ..sources import NcclRasSource


def _source(environ: Mapping[str, str], **options) -> "NcclRasSource | None":
    from ..sources import NcclRasSource

    return NcclRasSource.for_environment(environ, **options)


class RasProbe:
    """``report(procs)``: the report's text for this scrape, or None; ``procs`` are the attached
    ranks as (pid, create_time)."""

    def __init__(self, environ: Callable[[int], Mapping[str, str]] = _environ,
                 source: Callable[..., "NcclRasSource | None"] = _source,
                 clock: Callable[[], float] = time.monotonic, timeout_s: float = QUERY_TIMEOUT_S,
                 backoff_s: float = BACKOFF_S,
                 nodes: Callable[[], frozenset[str] | None] = local_addresses) -> None:
        self._environ = environ
        self._make = source
        self.clock = clock
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._nodes = nodes
        self._addr_of: dict[tuple[int, float | None], str | None] = {}
        self._sources: dict[str, object] = {}
        self._turn = 0
        self._nodes_at: float | None = None
        self._local: frozenset[str] | None = None
        self.queries = 0  # how many queries were sent (the cost, for tests and the curious)

    def local_nodes(self) -> frozenset[str] | None:
        now = self.clock()
        if self._nodes_at is None or now - self._nodes_at >= NODES_EVERY_S:
            self._local, self._nodes_at = self._nodes(), now
        return self._local

    def _address(self, pid: int, create_time: float | None) -> str | None:
        key = (pid, create_time)
        if key not in self._addr_of:
            if len(self._addr_of) > 1024:
                self._addr_of.clear()  # bounded; read again at the next scrape
            env = {k: v for k, v in self._environ(pid).items() if k in _KEYS}
            src = self._make(env, clock=self.clock, interval=0.0, timeout_s=self.timeout_s, backoff_s=self.backoff_s)
            addr = src.addr if src is not None else None
            if addr is not None and asks_no_resolver(addr) and \
                    (addr in self._sources or len(self._sources) < MAX_ADDRS):
                self._sources.setdefault(addr, src)
            else:
                addr = None
            self._addr_of[key] = addr
        return self._addr_of[key]

    def report(self, procs: Iterable[tuple[int, float | None]]) -> str | None:
        addrs = sorted({a for p, c in procs if (a := self._address(p, c)) is not None})
        if not addrs:
            return None
        addr = addrs[self._turn % len(addrs)]
        self._turn += 1
        src = self._sources[addr]
        before = src.last_reply  # type: ignore[attr-defined]
        src.poll()  # type: ignore[attr-defined]  # asks unless it is backing off; its events are not ours to log
        reply = src.last_reply  # type: ignore[attr-defined]
        if reply is before or reply is None:
            return None  # backing off: nothing asked
        self.queries += 1
        return reply.text
