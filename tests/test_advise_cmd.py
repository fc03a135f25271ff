"""`gputop advise`: headless findings as text or JSON, on the fake GPU source."""

import json

import pytest

from gputop.cli import main


@pytest.mark.timeout(60)
def test_advise_json_on_fake_gpus(capsys):
    assert main(["advise", "--fake", "2", "--interval", "0.5", "--duration", "4", "--json", "--window", "30"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "fake" and out["window_s"] == 30.0 and out["evaluations"] >= 2
    ids = [f["id"] for f in out["findings"]]
    # fake GPU 1 runs fp32 matmuls with idle tensor cores (GPM)
    assert "no-tensor-cores" in ids
    f = out["findings"][ids.index("no-tensor-cores")]
    assert 0 <= f["first_seen_s"] <= 3.5 and "allow_tf32" in f["action"]
    # its rule fired before it showed: it had to hold first
    fired = out["first_fired_s"]
    assert set(ids) <= set(fired)
    assert 0 <= fired["no-tensor-cores"] < f["first_seen_s"]
    log = out["evaluation_log"]
    assert 2 <= len(log) <= out["evaluations"] + 1
    assert [e["t_s"] for e in log] == sorted(e["t_s"] for e in log)
    assert out["evaluation_log_max"] == 60 and out["evaluation_log_left_out"] == max(0, out["evaluations"] - len(log))
    shown_at = next(e for e in log if "no-tensor-cores" in e["shown"])
    assert "no-tensor-cores" in shown_at["fired"] and shown_at["warmup"] is None
    assert all(isinstance(e["withdrawn"], dict) for e in log)  # rule id -> why it took its finding back
    assert {b["device"] for b in out["breakdown"]} == {"GPU 0", "GPU 1"}
    for bd in out["breakdown"]:
        assert sum(b["percent"] for b in bd["buckets"]) == 100
    assert "no-tensor-cores" in [s["id"] for s in out["seen"]]


@pytest.mark.timeout(60)
def test_advise_text_and_interrupt(capsys, monkeypatch):
    from gputop.session import Session

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(Session, "run_for", interrupted)
    assert main(["advise", "--fake", "1", "--duration", "30"]) == 0
    out = capsys.readouterr().out
    assert "(interrupted)" in out and "[fake GPU source]" in out
    assert "GPU 0: where the time went" in out


def test_advise_bad_pid_is_one_line(capsys):
    assert main(["advise", "--pid", "999999999", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gputop advise: error: no process with PID 999999999") and len(err.strip().splitlines()) == 1


def test_advise_rejects_bad_numbers(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["advise", "--duration", "0"])
    assert exc.value.code == 2


@pytest.mark.timeout(60)
def test_advise_records_what_it_judged_and_never_overwrites(capsys, tmp_path):
    rec = tmp_path / "advised.gputop"
    assert main(["advise", "--fake", "1", "--interval", "0.5", "--duration", "2", "--json", "--record", str(rec)]) == 0
    capsys.readouterr()
    assert rec.is_file() and rec.stat().st_mode & 0o777 == 0o600
    assert main(["info", str(rec)]) == 0
    info = capsys.readouterr().out
    assert " GPU polls" in info and not info.split("samples")[1].lstrip().startswith("0 GPU")
    before = rec.read_bytes()
    # A second run names the same file: one clear line, nothing written over.
    assert main(["advise", "--fake", "1", "--duration", "1", "--record", str(rec)]) != 0
    err = capsys.readouterr().err
    assert "already exists" in err and len(err.strip().splitlines()) == 1
    assert rec.read_bytes() == before
    # The --force the refusal points to exists, and overwrites only a recording.
    assert main(["advise", "--fake", "1", "--interval", "0.5", "--duration", "1", "--record", str(rec), "--force"]) == 0
    capsys.readouterr()
    assert rec.read_bytes() != before and main(["info", str(rec)]) == 0
    capsys.readouterr()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    # Without --force it says the file is not a recording, not "use --force" (which refuses too).
    assert main(["advise", "--fake", "1", "--duration", "1", "--record", str(notes)]) != 0
    err = capsys.readouterr().err
    assert "is not a gputop recording" in err and "--force" not in err
    assert main(["advise", "--fake", "1", "--duration", "1", "--record", str(notes), "--force"]) != 0
    assert notes.read_text() == "mine"


def test_the_progress_line_says_warming_up_rather_than_counting_it(capsys):
    """Warming up is the job's state, not a finding: '1 finding(s), top: warming-up' confused a
    new user."""
    import time

    from gputop.advisor import WARMUP_ID
    from gputop.commands.advise import _Progress
    from gputop.model import Finding, Severity

    def finding(fid, sev=Severity.INFO):
        return Finding(id=fid, title=fid, severity=sev, confidence=0.5, evidence=(), action="", ts=time.time())

    class Store:
        shown = [finding(WARMUP_ID)]

        def findings(self):
            return self.shown

        def pending_findings(self):
            return []

    class Session:
        store = Store()
        advisor = None

    p = _Progress(Session(), 30.0, time.time())
    p.tty = False
    p(1.0)
    assert "0 findings (the job is warming up)" in capsys.readouterr().err
    Session.store.shown = [finding("data-starved", Severity.WARNING)]
    p(7.0)
    err = capsys.readouterr().err
    assert "1 finding, top: data-starved" in err and "warming" not in err


@pytest.mark.timeout(60)
def test_advise_record_lasts_the_duration_asked(capsys, tmp_path):
    # -d 10 --record at 2 s polls watched, and recorded, 12 s: stopping waited for the next poll
    # and kept it, as `record --duration` no longer does.
    rec = tmp_path / "d.gputop"
    assert main(["advise", "--fake", "1", "--interval", "2", "--duration", "3", "--json", "--record", str(rec)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 3.0 <= out["duration_s"] < 3.5
    assert main(["info", "--json", str(rec)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["duration_s"] < 3.5
