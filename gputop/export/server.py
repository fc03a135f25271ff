"""``gputop export``: assemble the session, serve /metrics, stop cleanly on SIGTERM or SIGINT."""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from typing import Callable

from ..errors import OptionError, UserError, line, os_reason, say, warn
from .attach import Attacher
from .collector import GputopCollector
from .config import DEFAULT_LISTEN, DEFAULT_PORT
from .job_collector import JobCollector

# No job attached: the advisor's system checks need no second-by-second answer (as in the UI).
UNATTACHED_ADVISOR_EVERY_S = 10.0


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (all interfaces); UserError otherwise."""
    m = re.fullmatch(r"\s*(?:\[([^\]]*)\]|([^:\[\]]*)):(\d{1,5})\s*", text)
    if not m:
        raise OptionError("--listen", "not HOST:PORT", text, f"e.g. {DEFAULT_LISTEN}, [::1]:{DEFAULT_PORT} or :{DEFAULT_PORT}")
    host = m.group(1) if m.group(1) is not None else m.group(2)
    port = int(m.group(3))
    if port > 65535:
        raise OptionError("--listen", "port out of range", text, "0 to 65535")
    return host or "0.0.0.0", port


def open_session(interval: float, fake: int | None, pid: int | None, stuck_after: float, window: float):
    """The exporter's session: the same sources and advisor as the UI and ``advise``.
    Returns the session (not started) and a factory of stack samplers for ``--attach all``."""
    from ..session import Config, open_live, stack_sampler

    session = open_live(Config(interval=interval, fake=fake, pid=pid, stuck_after=stuck_after, window=window,
                               advisor_idle_every=UNATTACHED_ADVISOR_EVERY_S))
    return session, lambda p: stack_sampler(p, clock=session.clock)


# The paths served. prometheus-client's own app answers every path with the metrics (and a
# HEAD with 405), so a typo in a scrape config or a probe of /healthz would look like success.
# We keep its exposition (content negotiation, gzip, ?name[]= filtering) and put a small router
# in front: /metrics is the metrics, / a one-line pointer to it, anything else a one-line 404.
METRICS_PATH = "/metrics"
_ALLOW = "GET, HEAD, OPTIONS"
_INDEX = f"gputop export: Prometheus metrics at {METRICS_PATH}\n".encode()
_NOT_FOUND = f"404 Not Found: gputop export serves only {METRICS_PATH}\n".encode()


def make_app(registry):
    """The WSGI app: prometheus-client's exposition at /metrics, behind a strict path router.

    HEAD is answered like GET without the body (the same status and headers, Content-Length
    included, so it runs a collection like a GET); OPTIONS says what is allowed; other methods
    get 405. The 404 body is one fixed line: the request's path is not echoed back."""
    from prometheus_client import make_wsgi_app

    metrics = make_wsgi_app(registry)

    def reply(start_response, status: str, body: bytes, head: bool, headers=(), content_type="text/plain; charset=utf-8"):
        start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers])
        return [] if head else [body]

    def app(environ, start_response):
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET")
        head = method == "HEAD"
        if path not in (METRICS_PATH, "/"):
            return reply(start_response, "404 Not Found", _NOT_FOUND, head)
        if method == "OPTIONS":
            return reply(start_response, "200 OK", b"", False, [("Allow", _ALLOW)])
        if method not in ("GET", "HEAD"):
            return reply(start_response, "405 Method Not Allowed",
                         f"405 Method Not Allowed: {path} takes {_ALLOW}\n".encode(), False, [("Allow", _ALLOW)])
        if path == "/":
            return reply(start_response, "200 OK", _INDEX, head)
        # The exporter's app only knows GET: ask it for GET, and for a HEAD send its headers alone.
        got: list = []

        def keep(status, headers, exc_info=None):
            got[:] = [status, headers]

        body = b"".join(metrics({**environ, "REQUEST_METHOD": "GET"}, keep))
        status, headers = got
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"] + [("Content-Length", str(len(body)))]
        start_response(status, headers)
        return [] if head else [body]

    return app


def bind(host: str, port: int, registry):
    """The HTTP server (serving in a daemon thread), or a one-line UserError.

    The same machinery as prometheus-client's start_http_server (wsgiref, a thread per request
    that never blocks shutdown, no request log, the address family the host asks for), written
    out here only so that it serves make_app's router instead of the bare exposition app."""
    import errno
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, format, *args):  # no line per scrape on stderr
            pass

    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]

        class Server(ThreadingMixIn, WSGIServer):
            address_family = family
            daemon_threads = True  # a scrape in flight does not hold up the exit

        httpd = make_server(sockaddr[0], port, make_app(registry), Server, handler_class=Quiet)
    except OSError as exc:  # in use, not an address of this machine, no permission, unknown name
        why = os_reason(exc)
        shown = f"[{host}]" if ":" in host else host
        # A port another process holds is the machine's state, not a bad argument: exit 1, as a
        # run that fails on its own (README); an address not of this machine or a name that does
        # not resolve is bad input (2).
        busy = getattr(exc, "errno", None) == errno.EADDRINUSE
        raise UserError(f"cannot listen on {shown}:{port}: {why}", exit_code=1 if busy else 2) from None
    threading.Thread(target=httpd.serve_forever, name="gputop-export-http", daemon=True).start()
    return httpd


def _attached(session, attacher) -> Callable[[], set[int]]:
    """The PIDs whose stacks are sampled now: --attach all's, and the --pid target (with its
    job's local ranks) until it exits; an exited target stayed gputop_job_info{attached="1"} for
    as long as the exporter ran."""

    def attached() -> set[int]:
        pids = set(attacher.pids()) if attacher is not None else set()
        state = session.target_state if session.stacks is not None else None
        if session.target_pid is not None and state is not None and state.exited_at is None:
            pids.add(session.target_pid)
        # --pid of a launcher or of one rank: the session samples every local rank of its job.
        job = session.job
        if job is not None:
            pids.update(r.pid for r in job.ranks)
        return pids

    return attached


def _alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not yet reaped by its parent, does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def _judged(session, jobs):
    """What the advisor's findings speak of, as labels: (pid, job_id) of the process its last
    evaluation judged (named with --pid, else the one the evidence window took for the job), ''
    where none or not a rank. One process at a time: two label values, not one per process."""

    def judged() -> tuple[str, str]:
        advisor = session.advisor
        ctx = advisor.advisor.last_context if advisor is not None else None
        pid = ctx.target_pid if ctx is not None else None
        if pid is None:
            return "", ""
        ident = jobs.identities().get(pid) if jobs is not None else None
        return str(pid), ident.job if ident is not None else ""

    return judged


def _judged_memory(session):
    """The memory view of the advisor's last evaluation (None before one, or without a job)."""

    def memory():
        advisor = session.advisor
        ctx = advisor.advisor.last_context if advisor is not None else None
        return ctx.memory if ctx is not None else None

    return memory


def serve(
    listen: str,
    interval: float,
    fake: int | None,
    pid: int | None,
    attach_all: bool,
    max_attach: int,
    stuck_after: float,
    window: float,
    ready: Callable[[str], None] | None = None,
    host_label: str | None = None,
    attach_under: int | None = None,
) -> int:
    from prometheus_client import CollectorRegistry, ProcessCollector

    host, port = parse_listen(listen)
    session, sampler = open_session(interval, fake, pid, stuck_after, window)
    if session.attach_error:
        warn("export", f"{session.attach_error}; exporting GPU series without its causes")
    attacher = None
    if attach_all:
        from .attach import is_python
        from .cpu_ranks import RankScanner, is_under

        under = None if attach_under is None else (lambda p: is_under(p, attach_under))
        attacher = Attacher(session, sampler, max_attach=max_attach, ranks=RankScanner(is_python), under=under)
    if attacher is not None:
        session.pipeline.add_source(attacher)

    attached = _attached(session, attacher)

    jobs = None
    if attacher is not None or session.job is not None:
        # The ranks of distributed jobs among the attached: what the job view (gputop job) reads.
        from ..sources import host_name, read_identity
        from .ras_probe import RasProbe

        label = host_label or host_name()
        jobs = JobCollector(session.store, attached, lambda p: read_identity(p, label),
                            window=session.window, stuck_after=stuck_after, ras=RasProbe(),
                            judged_job=lambda: _judged(session, jobs)()[1])
    if attacher is not None and jobs is not None:
        # The advisor learns the attached job's ranks as a --pid session's does (one ranks event),
        # so it judges a straggler's waiting peers as ranks, not as stuck processes.
        from .attach import RankNamer

        def judge(pid: int) -> None:
            # The advisor (and the stuck watch) follow the session's target: the named job's
            # rank 0, as with --pid of its launcher.
            session.target_pid = pid

        session.pipeline.add_source(RankNamer(session.store, jobs.identities, judge=judge))

    registry = CollectorRegistry()
    registry.register(GputopCollector(session.store, interval=session.interval, window=session.window,
                                      attached=attached, mode=session.mode,
                                      judged=_judged(session, jobs), alive=_alive,
                                      judged_memory=_judged_memory(session)))
    if jobs is not None:
        registry.register(jobs)
    # process_cpu_seconds_total and friends: the exporter's own cost, watchable from the fleet.
    ProcessCollector(registry=registry)
    try:
        httpd = bind(host, port, registry)
    except UserError:
        session.pipeline.stop()
        raise
    stop = threading.Event()
    came: list[int] = []

    def on_signal(signum, frame):
        came.append(signum)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    session.pipeline.start()
    shown = f"[{host}]" if ":" in host else host
    serving = line("export", f"serving http://{shown}:{httpd.server_port}/metrics" + (
        " [fake GPU source]" if session.mode == "fake" else ""))
    print(serving, file=sys.stderr, flush=True)
    if ready is not None:
        ready(serving)
    try:
        while not stop.wait(1.0):  # a timed wait: the handlers run between waits
            pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        t = time.monotonic()
        httpd.shutdown()
        httpd.server_close()
        session.pipeline.stop()
        say("export", f"stopped ({time.monotonic() - t:.1f} s to close)")
    # As `record` and `advise`: ended by SIGTERM (systemd's stop, Kubernetes, `timeout`) is 143, the
    # status that says "terminated"; Ctrl-C, the way to end it by hand, is 0.
    return 128 + signal.SIGTERM if signal.SIGTERM in came else 0
