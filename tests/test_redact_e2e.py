"""Secrets on a real process's command line, through every path that stores or prints it: the
host source (the screen), the recording (file, ``info --json``), and ``gputop stacks --json``
(with and without ``--native``, whose py-spy header repeats the raw command line). The forms are
the ones a new-user test found left in clear: JSON in an argument, HTTP headers, Hydra overrides,
URLs with an empty user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop.model import Event, ProcSample
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.sources.host import HostSource

from idle_process import idle_python

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
T0 = 1_767_225_600.0

SECRET_ARGS = [
    "--env", '{"HF_TOKEN": "hf_JSONSECRET5", "api_key": "JSONSECRET6", "password":"JSONSECRET7"}',
    "-H", "Authorization: Bearer BEARERSECRET4",
    "--header", "X-Api-Key: HDRSECRET8",
    "logger.wandb.api_key=HYDRASECRET1", "++hf_token=HYDRASECRET2", "trainer.token=HYDRASECRET9",
    "--redis", "redis://:REDISSECRET3@host:6379",
    "--aws", "AKIAQWERTYUIOPASDFGH",
    "--max_tokens=512", "--tokenizer=gpt2",  # kept: not secrets
]
SECRETS = ["JSONSECRET", "BEARERSECRET", "HDRSECRET", "HYDRASECRET", "REDISSECRET", "AKIAQWERTYUIOPASDFGH"]


def _no_secret(text: str, where: str) -> None:
    for s in SECRETS:
        assert s not in text, (where, s, text[:2000])


@pytest.fixture(scope="module")
def secret_child():
    with idle_python(SECRET_ARGS, {"PATH": os.environ.get("PATH", "")}) as p:
        yield p


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([PY, "-m", "gputop", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL)


def test_host_source_cmdline(secret_child):
    src = HostSource(target_pid=secret_child.pid)
    time.sleep(0.2)
    target = [s for s in src.poll() if isinstance(s, ProcSample) and s.pid == secret_child.pid][0]
    _no_secret(target.cmdline, "host source")
    assert "Authorization: Bearer ***" in target.cmdline and "--max_tokens=512" in target.cmdline


def test_recording_second_pass(tmp_path):
    """A sample that reached the writer unredacted (a source that missed it), the session's argv
    and target command line, and an event quoting the command line: none reaches the file."""
    raw_line = " ".join(["python", "train.py", *SECRET_ARGS])
    path = tmp_path / "r.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", host="h", argv=("gputop", "record", *SECRET_ARGS),
                                target_cmdline=raw_line))
    w.flush([ProcSample(ts=T0, pid=7, name="python", cmdline=raw_line),
             Event(ts=T0, source="host", message=f"target started: {raw_line}")])
    w.finish()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    for s in SECRETS:
        assert s.encode() not in raw, s
    got = Reader(path).proc_samples(T0 - 1, T0 + 1)[0]
    assert "logger.wandb.api_key=***" in got.cmdline and "--tokenizer=gpt2" in got.cmdline


def test_stacks_json(secret_child):
    for extra in ([], ["--native"]):
        proc = run_cli("stacks", "--pid", str(secret_child.pid), "--json", *extra)
        if proc.returncode != 0 and "ptrace" in (proc.stderr + proc.stdout).lower():
            pytest.skip("py-spy cannot attach here: " + proc.stderr[-200:])
        assert proc.returncode == 0, proc.stderr
        _no_secret(proc.stdout + proc.stderr, f"stacks --json {extra}")
        out = json.loads(proc.stdout)
        assert "trainer.token=***" in out["cmdline"] and '"api_key": "***"' in out["cmdline"], out["cmdline"]
        if extra:
            assert "***" in out["native"]


def test_record_command(secret_child, tmp_path):
    path = tmp_path / "s.gputop"
    proc = run_cli("record", "-o", str(path), "--fake", "1", "--pid", str(secret_child.pid), "--duration", "2s")
    assert proc.returncode == 0, proc.stderr
    info = run_cli("info", "--json", str(path))
    assert info.returncode == 0, info.stderr
    _no_secret(proc.stdout + proc.stderr + info.stdout + info.stderr, "record/info")
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    for s in SECRETS:
        assert s.encode() not in raw, s
    with Reader(path) as r:
        cmdlines = " ".join(p.cmdline for p in r.proc_samples(float("-inf"), float("inf")) if p.pid == secret_child.pid)
    assert "redis://:***@host:6379" in cmdlines, cmdlines[:500]


def test_an_old_recording_is_redacted_as_it_is_read(tmp_path):
    """A recording written before redaction knew a secret's form holds it in clear: reading it
    (info, report, replay) redacts the command lines and environment values again."""
    import sqlite3

    path = tmp_path / "old.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", host="h", argv=("gputop", "record"), target_cmdline="python train.py"))
    w.flush([ProcSample(ts=T0, pid=7, name="python", cmdline="python train.py", env=(("HF_TOKEN", "x"),))])
    w.finish()
    raw_line = " ".join(["python", "train.py", *SECRET_ARGS])
    con = sqlite3.connect(path)
    con.execute("UPDATE processes SET cmdline = ?, env = ?", (raw_line, json.dumps([["WANDB_API_KEY", "ENVSECRET1"]])))
    con.execute("UPDATE sessions SET target_cmdline = ?, argv = ?", (raw_line, raw_line))
    con.commit()
    con.close()
    r = Reader(path)
    got = r.proc_samples(T0 - 1, T0 + 1)[0]
    _no_secret(got.cmdline, "processes.cmdline")
    assert "ENVSECRET1" not in json.dumps(got.env)
    assert "--tokenizer=gpt2" in got.cmdline
    for s in r.sessions:
        _no_secret(s["target_cmdline"] or "", "sessions.target_cmdline")
        _no_secret(s["argv"] or "", "sessions.argv")
