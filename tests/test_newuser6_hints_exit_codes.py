"""The demo's hint named `pip install 'gputop[torch]'` (a package index's gputop, maybe another
project's) where README says `pip install '.[torch]'` from the checkout; `job` and `autopsy` exited 1
on bad input where every other command exits 2; README did not say how `advise` exits when stopped
(0 on Ctrl-C, 128 + the signal on SIGTERM or SIGHUP)."""

from __future__ import annotations

import importlib.util
import re
import socket
import threading
from http.server import HTTPServer
from pathlib import Path

import pytest

from gputop.cli import main
from test_job_view import _Prom, load

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_demos_hint_is_readmes_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["demo"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "pip install '.[torch]'" in README
    assert "pip install '.[torch]'" in err and "gputop[torch]" not in err
    # The CPU build, as README gives it for a machine without an NVIDIA GPU.
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in README
    assert "https://download.pytorch.org/whl/cpu" in err


@pytest.fixture
def prom():
    """test_job_view's fake Prometheus server."""
    _Prom.payloads = {"job": load("job_straggler.json"), "list": load("jobs_list.json")}
    srv = HTTPServer(("127.0.0.1", 0), _Prom)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_job_bad_input_exits_2_and_a_server_that_fails_1(prom, capsys):
    assert main(["job", "--prometheus", "ftp://x", "j"]) == 2  # not a URL gputop can read
    assert "http(s) URL" in capsys.readouterr().err
    assert main(["job", "--prometheus", "http://h:9090/?q=1", "j", "--once"]) == 2
    capsys.readouterr()
    _Prom.payloads["job"] = {"status": "success", "data": {"resultType": "vector", "result": []}}
    assert main(["job", "--prometheus", prom, "nope", "--once"]) == 2  # no such job: as `replay` of no such file
    assert "no job 'nope'" in capsys.readouterr().err
    # The server is not there: the input was fine, the run failed.
    assert main(["job", "--prometheus", f"http://127.0.0.1:{_free_port()}", "j", "--once"]) == 1
    assert "cannot reach" in capsys.readouterr().err
    assert main(["job", "--prometheus", f"http://127.0.0.1:{_free_port()}"]) == 1


def test_autopsy_bad_input_exits_2(tmp_path, capsys):
    pytest.importorskip("torch")  # autopsy needs PyTorch's analyzer before it looks at any file
    assert main(["autopsy", str(tmp_path / "nonexistent")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["autopsy", str(tmp_path)]) == 2  # a directory with no dumps
    assert "no flight-recorder dumps in" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("x")
    assert main(["autopsy", str(tmp_path / "notes.txt")]) == 2  # not named as a dump
    capsys.readouterr()
    # A dump that is there but cut short or foreign stays exit 1 (README: "one line, exit 1").
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"")
    assert main(["autopsy", str(tmp_path)]) == 1
    assert "is empty" in capsys.readouterr().err


def test_readme_says_how_advise_exits_when_stopped():
    """What README says is what advise does (tests/test_newuser5_advise_signals.py runs it)."""
    text = " ".join(README.split())
    said = re.search(r"`advise` exits 0 when its watch ends or on Ctrl-C[^.]*\.", text)
    assert said, "README does not say advise's exit status"
    assert "128 + the signal's number (143 after SIGTERM, 129 after SIGHUP" in said.group(0)
    assert "prints its report" in said.group(0)
