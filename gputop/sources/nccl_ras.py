"""NCCL's RAS service, asked for its status report: which rank of which communicator has launched
how many collectives, which ranks are missing or dead. Standard library sockets only.

Every process that uses NCCL 2.24 or later runs a RAS thread (unless ``NCCL_RAS_ENABLE`` is set
to anything but 1) that listens for clients on ``localhost:28028``, or on the ``host:port`` (or
``[ipv6]:port``) in ``NCCL_RAS_ADDR``. Asking it costs the job nothing measurable: the RAS thread
gathers the other ranks' data over its own network, and the training threads are not touched.

The protocol, as NCCL's sources give it (``src/ras/client.cc``: the ``ncclras`` client;
``src/ras/client_support.cc``: the server side; ``src/ras/ras_internal.h``: the constants), and as
read in tags v2.24.3-1 to v2.30 (it has not changed since RAS appeared in 2.24):

1. Connect over TCP. Every exchange is text, one command a line, ``\\n``-terminated (the server
   also drops a ``\\r`` before it, so telnet works); commands are matched case-insensitively.
2. Send ``CLIENT PROTOCOL 2``; the server answers ``SERVER PROTOCOL 2`` whatever version the
   client gave (``NCCL_RAS_CLIENT_PROTOCOL`` is 2 in every release so far). ``ncclras`` only warns
   on another number and goes on; so does this client.
3. Optionally ``TIMEOUT <seconds>``: how long the RAS thread waits for the other processes' data
   (5 s by default, ``RAS_COLLECTIVE_LEG_TIMEOUT_SEC``; ``0`` disables the wait limit, so it is
   never sent here). The answer is ``OK``, or ``ERROR: Invalid timeout value ...``. Past that
   wait, peers behind a delayed connection are given up on at once; others may take up to 5 s
   more (``RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC``). This client asks for about half its own time
   limit, at least 1 s, so that a stopped rank still gives a report (with the rank missing).
4. ``STATUS`` (or ``VERBOSE STATUS``: more ranks named in each group). The server sends the
   report in pieces as it is gathered (version, job summary, then the communicators) and closes
   the connection once all is sent: the report is everything up to the close.
   ``ERROR: Unknown command ...`` answers anything else. (2.28.7 added ``SET FORMAT json``, 2.29
   a ``MONITOR`` mode; neither is used here: the text report is what every version gives.)

The server buffers at most 1024 bytes of a command line, and its report starts with
``NCCL version``. Bounds here: the whole query, connection included, ends within ``timeout_s``
(3 s by default); at most ``MAX_REPORT_BYTES`` (1 MiB) are read; a name other than a numeric
address or ``localhost`` is resolved on a helper thread so that a slow resolver cannot hold the
query past its time. ``localhost`` (NCCL's default) is tried as 127.0.0.1 and then ::1, since
NCCL binds whichever address the resolver gives first.

``query`` never raises for the ordinary failures (nothing listening, refused, timed out, a peer
that speaks something else, a report past the size cap): it gives ``RasReply(text=None,
reason=...)``. ``NcclRasSource`` polls it for the pipeline and decides nothing: the report's
meaning is ``gputop.analysis.nccl_ras``'s.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from ..model import Event
from ..redact import redact_text

# NCCL's defaults (src/ras/ras_internal.h: NCCL_RAS_CLIENT_PORT, NCCL_RAS_CLIENT_PROTOCOL).
DEFAULT_PORT = 28028
DEFAULT_ADDR = f"localhost:{DEFAULT_PORT}"
PROTOCOL = 2
# The whole query, connect to close. A healthy job answers in milliseconds (the fixtures say
# 0.000 s); one with a stopped rank takes the RAS wait asked for (1 s here) and a little more.
DEFAULT_TIMEOUT_S = 3.0
# A text report of a 2-rank job is ~1 KB; NCCL names at most 10 ranks per group (25 % of a
# communicator) unless verbose, so even a large job's report is tens of KB.
MAX_REPORT_BYTES = 1 << 20
# The server's own limit on a command line (client_support.cc: recvBuffer[1024]); the handshake
# and TIMEOUT answers are single short lines.
MAX_LINE_BYTES = 1024
# Polling: a report every 2 s tells moving counts from frozen ones within a few seconds; an
# unreachable service is asked again every 30 s (a job that has not started NCCL yet, or none).
DEFAULT_INTERVAL_S = 2.0
UNREACHABLE_BACKOFF_S = 30.0

SOURCE = "nccl-ras"
# Joins a report's lines into one event line (analysis.nccl_ras.LINE_SEP): a printable character
# NCCL's reports never contain.
LINE_SEP = " \u23ce "


# --------------------------------------------------------------------------- addresses


def _env_dict(environ: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> dict[str, str]:
    return {} if environ is None else dict(environ)


def _strtoll(text: str) -> int | None:
    """The leading integer of ``text`` as C's ``strtoll(text, NULL, 0)`` reads it (decimal, 0x hex,
    0 octal; no digits is 0), which is how NCCL reads its integer parameters."""
    m = re.match(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)?", text)
    if m is None or not m.group(2):
        return 0
    digits = m.group(2)
    if digits[:2].lower() == "0x":
        value = int(digits, 16)
    elif digits.startswith("0") and len(digits) > 1:
        value = int(digits, 8)
    else:
        value = int(digits)
    value = -value if m.group(1) == "-" else value
    if not -(2**63) <= value < 2**63:
        return None  # ERANGE: NCCL keeps its default
    return value


def environ_of(pid: int) -> dict[str, str]:
    """The environment of process ``pid`` (empty when it cannot be read: another user's, gone)."""
    import psutil

    try:
        return dict(psutil.Process(pid).environ())
    except (psutil.Error, OSError):
        return {}


def ras_enabled(environ: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> bool:
    """Whether a process with this environment runs NCCL's RAS service. NCCL (bootstrap.cc) starts
    it when the parameter ``NCCL_RAS_ENABLE`` is exactly 1, which is the default when it is unset,
    empty or out of range; ``0`` (or any other number) turns it off."""
    value = _env_dict(environ).get("NCCL_RAS_ENABLE")
    if value is None or value == "":
        return True
    n = _strtoll(value)
    return n is None or n == 1


def ras_address(environ: Mapping[str, str] | Iterable[tuple[str, str]] | None = None) -> str | None:
    """The address a rank's RAS service listens on, from that rank's environment (a mapping, or
    the ``(name, value)`` pairs of ``ProcSample.env``): ``NCCL_RAS_ADDR`` when set, else
    ``localhost:28028``. None when the rank runs no RAS service (``NCCL_RAS_ENABLE`` not 1) or
    when ``NCCL_RAS_ADDR`` is not an address NCCL could listen on (then NCCL logs that it failed
    to open the socket, and nothing listens). NCCL also reads its settings from nccl.conf files
    (``NCCL_CONF_FILE``, ``~/.nccl.conf``, ``/etc/nccl.conf``), which the environment does not
    show: a caller that knows them passes them merged under the environment."""
    env = _env_dict(environ)
    if not ras_enabled(env):
        return None
    addr = (env.get("NCCL_RAS_ADDR") or "").strip()
    if not addr:
        return DEFAULT_ADDR
    try:
        split_address(addr)
    except ValueError:
        return None
    return addr


def split_address(addr: str) -> tuple[str, int]:
    """``host:port`` or ``[ipv6]:port`` (``[fe80::1%eth0]:port`` too) as NCCL_RAS_ADDR spells it,
    into host and port. Raises ValueError for anything else."""
    addr = addr.strip()
    if addr.startswith("["):
        host, sep, rest = addr[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"not [IPv6]:port: {addr!r}")
        port_text = rest[1:]
    else:
        # NCCL splits at every ':' and reads the second field as the port (more fields are ignored).
        host, sep, rest = addr.partition(":")
        port_text = rest.split(":", 1)[0]
        if not sep:
            raise ValueError(f"not host:port: {addr!r}")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"not host:port: {addr!r}")
    return host, int(port_text)


# --------------------------------------------------------------------------- the query


@dataclass(frozen=True, slots=True)
class RasReply:
    """One query's outcome: the report's text, or None and why not."""

    text: str | None
    reason: str | None = None  # why there is no text (None when there is)
    addr: str = ""
    server_protocol: int | None = None  # what the server said in its handshake
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.text is not None


class _Failed(Exception):
    """A query that ends without a report; the message is the reason."""


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Failed("timed out")
    return left


def _resolve(host: str, port: int, deadline: float) -> list[tuple[int, tuple]]:
    """(family, sockaddr) to try, in order, within the deadline."""
    if host == "localhost":
        return [(socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET6, ("::1", port, 0, 0))]
    numeric = True
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        numeric = False
    if numeric:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
        except (OSError, UnicodeError) as exc:
            raise _Failed(f"bad address {host!r}: {exc}") from None
        return [(fam, sa) for fam, _, _, _, sa in infos]
    # A name: the resolver may take seconds (DNS), and getaddrinfo has no time limit of its own.
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            box["error"] = exc

    t = threading.Thread(target=work, name="gputop-nccl-ras-resolve", daemon=True)
    t.start()
    t.join(_remaining(deadline))
    if t.is_alive():
        raise _Failed(f"resolving {host!r} timed out")
    if "error" in box:
        raise _Failed(f"cannot resolve {host!r}: {box['error']}")
    return [(fam, sa) for fam, _, _, _, sa in box["infos"]]  # type: ignore[union-attr]


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    errors: list[str] = []
    for family, sockaddr in _resolve(host, port, deadline):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(_remaining(deadline))
            sock.connect(sockaddr)
            return sock
        except _Failed:
            sock.close()
            raise
        except TimeoutError:
            sock.close()
            raise _Failed(f"connecting to {sockaddr[0]} port {port} timed out") from None
        except OSError as exc:
            sock.close()
            errors.append(f"{sockaddr[0]}: {exc.strerror or exc}")
    raise _Failed("nothing listening (" + "; ".join(errors) + ")" if errors else "no address to connect to")


class _Reader:
    """Reads from a connected socket within a deadline and a size cap."""

    def __init__(self, sock: socket.socket, deadline: float, cap: int) -> None:
        self.sock = sock
        self.deadline = deadline
        self.cap = cap
        self.buf = bytearray()
        self.total = 0
        self.eof = False

    def _fill(self) -> None:
        self.sock.settimeout(_remaining(self.deadline))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise _Failed(f"timed out after {self.total} bytes") from None
        if not data:
            self.eof = True
            return
        self.total += len(data)
        if self.total > self.cap:
            raise _Failed(f"answer larger than {self.cap} bytes")
        self.buf += data

    def raw_line(self) -> bytes:
        """The next line, its ``\\n`` included."""
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE_BYTES:
                raise _Failed("not an NCCL RAS service (no line end in its first 1024 bytes)")
            if self.eof:
                raise _Failed("connection closed " + ("before any answer" if not self.buf else "in mid-line"))
            self._fill()
        end = self.buf.index(b"\n") + 1
        raw = bytes(self.buf[:end])
        del self.buf[:end]
        return raw

    def line(self) -> str:
        return self.raw_line().decode("utf-8", errors="replace").rstrip("\r\n")

    def rest(self) -> bytes:
        while not self.eof:
            self._fill()
        out, self.buf = bytes(self.buf), bytearray()
        return out


def _send(sock: socket.socket, line: str, deadline: float) -> None:
    sock.settimeout(_remaining(deadline))
    try:
        sock.sendall(line.encode("ascii") + b"\n")
    except TimeoutError:
        raise _Failed("timed out while sending") from None


def _wait_s(timeout_s: float) -> int:
    """The RAS wait to ask for: about half the query's time, whole seconds, never 0 (0 = no limit)."""
    return max(1, int(timeout_s / 2))


def query(addr: str = DEFAULT_ADDR, timeout_s: float = DEFAULT_TIMEOUT_S, *, verbose: bool = False,
          max_bytes: int = MAX_REPORT_BYTES) -> RasReply:
    """Ask the RAS service at ``addr`` (``host:port``) for its status report. Ends within
    ``timeout_s``; never raises for a network fault or a peer that is not NCCL."""
    start = time.monotonic()
    deadline = start + max(0.0, timeout_s)
    proto: int | None = None

    def failed(reason: str) -> RasReply:
        return RasReply(None, reason, addr, proto, time.monotonic() - start)

    try:
        host, port = split_address(addr)
    except ValueError as exc:
        return failed(str(exc))
    sock: socket.socket | None = None
    try:
        sock = _connect(host, port, deadline)
        rd = _Reader(sock, deadline, max_bytes)
        _send(sock, f"CLIENT PROTOCOL {PROTOCOL}", deadline)
        hello = rd.line()
        if not hello.upper().startswith("SERVER PROTOCOL "):
            raise _Failed(f"not an NCCL RAS service (it said {hello[:80]!r})")
        m = re.match(r"\s*(\d+)", hello[len("SERVER PROTOCOL "):])
        proto = int(m.group(1)) if m else None
        _send(sock, f"TIMEOUT {_wait_s(timeout_s)}", deadline)
        ack = rd.line().strip()
        if ack.upper() != "OK":
            raise _Failed(f"TIMEOUT refused: {ack[:80]!r}")
        _send(sock, "VERBOSE STATUS" if verbose else "STATUS", deadline)
        # The report's first line says whether one is coming: an "ERROR: ..." answer leaves the
        # connection open, so waiting for the close would only wait for the time limit.
        try:
            first = rd.raw_line()
        except _Failed:
            if rd.eof and not rd.buf:
                raise _Failed("no report (connection closed)") from None
            raise
        if not first.startswith(b"NCCL version"):
            said = first.decode("utf-8", errors="replace").strip()[:80]
            raise _Failed(f"no report (it said {said!r})")
        text = (first + rd.rest()).decode("utf-8", errors="replace")
        return RasReply(text, None, addr, proto, time.monotonic() - start)
    except _Failed as exc:
        return failed(str(exc))
    except OSError as exc:  # reset by peer, broken pipe, unreachable network, ...
        return failed(exc.strerror or str(exc) or type(exc).__name__)
    finally:
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def query_status(addr: str = DEFAULT_ADDR, timeout_s: float = DEFAULT_TIMEOUT_S, *, verbose: bool = False,
                 max_bytes: int = MAX_REPORT_BYTES) -> str | None:
    """The status report's text, or None (``query`` says why)."""
    return query(addr, timeout_s, verbose=verbose, max_bytes=max_bytes).text


# --------------------------------------------------------------------------- the source

# "Communicators... (0.000s)": how long NCCL took to gather the report, different every time.
_TIMING = re.compile(r"^(Communicators\.\.\.) \(\d+(?:\.\d+)?s\)$", re.M)


def comparable(text: str) -> str:
    """The report without what changes at every query (the time NCCL took to gather it)."""
    return _TIMING.sub(r"\1", text)


class NcclRasSource:
    """NCCL's RAS status report of the job, as ``Event``s (source ``"nccl-ras"``, message = the
    report's text, redacted): one when the report differs from the last one sent (the time NCCL
    took to gather it aside), and one ``info`` event when the service cannot be reached (then it
    is asked again every ``backoff_s``). A report's event stands until this source's next event:
    while none comes, the service keeps answering with the same text, which is what tells a hang
    (counts that do not move) from a slow rank. After an outage the first report is sent again
    even if unchanged. Polls at most every ``interval`` seconds by ``clock``; decides nothing."""

    name = SOURCE

    def __init__(self, addr: str = DEFAULT_ADDR, *, clock: Callable[[], float] = time.time,
                 interval: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S,
                 backoff_s: float = UNREACHABLE_BACKOFF_S, verbose: bool = False,
                 query_fn: Callable[..., RasReply] = query) -> None:
        self.addr = addr
        self.clock = clock
        self.interval = interval
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.verbose = verbose
        self._query = query_fn
        self._next_at: float | None = None
        self._last: str | None = None  # comparable() of the last report sent
        self._told_unreachable = False
        self.last_reply: RasReply | None = None
        self.confirmed_at: float | None = None  # when the last report sent was last read again

    @classmethod
    def for_environment(cls, environ: Mapping[str, str] | Iterable[tuple[str, str]] | None,
                        **kwargs) -> "NcclRasSource | None":
        """A source for the rank with this environment, or None when it runs no RAS service."""
        addr = ras_address(environ)
        return None if addr is None else cls(addr, **kwargs)

    def poll(self) -> list[object]:
        now = self.clock()
        # A poll due within a tenth of the interval is due: the pipeline wakes this source every
        # ``interval`` by its own clock, and a wake a hair earlier than the last one skipped a
        # whole interval (reports 10 s apart at 5 s, read by the analysis as frozen counts).
        if self._next_at is not None and now < self._next_at - 0.1 * self.interval:
            return []
        reply = self._query(self.addr, self.timeout_s, verbose=self.verbose)
        self.last_reply = reply
        if reply.text is None:
            self._next_at = now + self.backoff_s
            self._last = None
            self.confirmed_at = None
            if self._told_unreachable:
                return []
            self._told_unreachable = True
            return [Event(now, SOURCE, f"NCCL RAS service at {self.addr} not reachable ({reply.reason}); "
                                       f"asking again every {self.backoff_s:g} s", "debug")]
        self._next_at = now + self.interval
        self._told_unreachable = False
        text = redact_text(reply.text)
        key = comparable(text)
        self.confirmed_at = now
        if key == self._last:
            return []
        self._last = key
        # Data for the analysis (analysis.nccl_ras), not a line for the status bar; one line (an
        # event is one line, and a recording keeps no control characters): the report's lines
        # joined by LINE_SEP, which analysis.nccl_ras splits again.
        return [Event(now, SOURCE, LINE_SEP.join(text.splitlines()), "debug")]

    def close(self) -> None:
        pass


__all__ = [
    "DEFAULT_ADDR", "DEFAULT_INTERVAL_S", "DEFAULT_PORT", "DEFAULT_TIMEOUT_S", "MAX_REPORT_BYTES", "PROTOCOL",
    "SOURCE", "UNREACHABLE_BACKOFF_S", "NcclRasSource", "RasReply", "comparable", "query", "query_status",
    "environ_of", "ras_address", "ras_enabled", "split_address",
]
