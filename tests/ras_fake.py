"""A stand-in for NCCL's RAS service on 127.0.0.1 for the exporter's tests: it answers as
NCCL's client socket does ("CLIENT PROTOCOL n" -> "SERVER PROTOCOL 2", "TIMEOUT n" -> "OK",
"STATUS" -> the report, then close), serving whatever ``report`` holds at the moment it is
asked, so a test can move the counts between scrapes. ``mode="silent"`` accepts and never
answers. One daemon thread; ``close()`` stops it."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


def fixture(name: str) -> str:
    return (FIXTURES / f"ras-{name}.txt").read_text()


class FakeRas:
    def __init__(self, report: str = "", mode: str = "ras") -> None:
        self.report = report
        self.mode = mode
        self.connections = 0
        self.commands: list[str] = []
        self._stop = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._run, name="test-fake-ras", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(0.05)
                try:
                    self._serve(conn)
                except OSError:
                    pass

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        while not self._stop.is_set():
            try:
                data = conn.recv(4096)
            except socket.timeout:
                continue
            if not data:
                return
            if self.mode == "silent":
                continue
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.decode().strip()
                self.commands.append(cmd)
                low = cmd.lower()
                if low.startswith("client protocol"):
                    conn.sendall(b"SERVER PROTOCOL 2\n")
                elif low.startswith("timeout"):
                    conn.sendall(b"OK\n")
                elif low in ("status", "verbose status"):
                    conn.sendall(self.report.encode())
                    return
                else:
                    conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sock.close()
