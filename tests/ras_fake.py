"""A stand-in for NCCL's RAS service on 127.0.0.1, the one the client's, the exporter's and the
job view's tests share.

It listens on an ephemeral port and answers as NCCL's client socket does
(src/ras/client_support.cc): "CLIENT PROTOCOL n" -> "SERVER PROTOCOL 2", "TIMEOUT n" -> "OK"
("ERROR: Invalid timeout value" for anything but a whole number), "STATUS" / "VERBOSE STATUS" ->
the report in two pieces (NCCL sends what it has, then gathers the rest), then close; anything
else -> "ERROR: Unknown command ...". It serves whatever ``report`` holds at the moment it is
asked, so a test can move the counts between scrapes. Modes for the faults: "silent" (accepts,
never answers), "garbage" (an HTTP answer), "stall" (half a report, then nothing),
"refuse-status". A subclass may replace ``_serve`` to send anything at all. One daemon thread;
it stops when closed, or after ``life_s`` whatever happens (a test that forgets to close it).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


def fixture(name: str) -> str:
    """A real RAS report (NCCL 2.28.9, a 2-rank DDP job): "healthy", "straggler", "hang"."""
    return (FIXTURES / f"ras-{name}.txt").read_text(encoding="utf-8")


class FakeRas:
    def __init__(self, report: str = "", mode: str = "ras", life_s: float = 60.0) -> None:
        self.report = report
        self.mode = mode
        self.commands: list[str] = []
        self.connections = 0
        self._stop = threading.Event()
        self._deadline = time.monotonic() + life_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._run, name="test-fake-ras", daemon=True)
        self._thread.start()

    def _alive(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline

    def _run(self) -> None:
        while self._alive():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            with conn:
                conn.settimeout(0.05)
                try:
                    self._serve(conn)
                except OSError:
                    pass

    def _idle(self, conn: socket.socket) -> None:
        """Read and never answer, until the client gives up or the server stops."""
        while self._alive():
            try:
                if not conn.recv(4096):
                    return
            except socket.timeout:
                continue

    def _serve(self, conn: socket.socket) -> None:
        if self.mode == "silent":
            return self._idle(conn)
        if self.mode == "garbage":
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        buf = b""
        while self._alive():
            try:
                data = conn.recv(4096)
            except socket.timeout:
                continue
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.decode().rstrip("\r")
                self.commands.append(cmd)
                low = cmd.lower()
                if low.startswith("client protocol "):
                    conn.sendall(b"SERVER PROTOCOL 2\n")
                elif low.startswith("timeout "):
                    arg = cmd[len("timeout "):]
                    conn.sendall(b"OK\n" if arg.isdigit() else f"ERROR: Invalid timeout value {arg}\n".encode())
                elif low in ("status", "verbose status") and self.mode != "refuse-status":
                    report = self.report.encode()
                    cut = report.find(b"Communicators")
                    cut = cut if cut > 0 else len(report) // 2
                    conn.sendall(report[:cut])  # NCCL sends what it has, then gathers the rest
                    if self.mode == "stall":
                        return self._idle(conn)
                    conn.sendall(report[cut:])
                    return  # the server closes once the report is sent
                else:
                    conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sock.close()
