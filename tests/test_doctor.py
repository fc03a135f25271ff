"""`gputop doctor`: its help, and torch's numpy warning turned into a doctor line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

from gputop.cli import build_parser
from gputop.commands import doctor

NUMPY_WARNING = "Failed to initialize NumPy: No module named 'numpy'"


def test_doctor_help_has_a_description(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["doctor", "-h"])
    out = capsys.readouterr().out
    body = out.split("\n\n")[1]  # after the usage block: the description
    assert body.startswith("Check whether this machine can be monitored")


@pytest.fixture
def warning_torch(tmp_path, monkeypatch):
    """A stand-in torch whose import warns as the CPU wheels do without numpy."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        import types, warnings
        warnings.warn("{NUMPY_WARNING} (Triggered internally at tensor_numpy.cpp:84.)", UserWarning)
        warnings.warn("something else torch says", DeprecationWarning)
        __version__ = "2.13.0+cpu"
        version = types.SimpleNamespace(cuda=None, hip=None)
        cuda = types.SimpleNamespace(is_available=lambda: False)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    yield
    sys.modules.pop("torch", None)


def test_numpy_missing_is_a_doctor_line_not_torchs_warning(warning_torch, monkeypatch, recwarn):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: None if dist == "numpy" else real(dist))
    checks = doctor.torch_checks()
    assert ("numpy", True, "not installed (torch warns without it; gputop does not need it)") in checks
    assert checks[0][0] == "torch" and checks[1][0] == "torch.cuda"
    texts = [str(w.message) for w in recwarn]
    assert not any("NumPy" in t for t in texts)
    assert "something else torch says" in texts  # other warnings are not swallowed


@pytest.mark.filterwarnings("ignore:something else torch says")
def test_numpy_installed_but_unusable_says_why(warning_torch, monkeypatch):
    monkeypatch.setattr(doctor, "_version", lambda dist: "2.4.6" if dist == "numpy" else "1")
    (check,) = [c for c in doctor.torch_checks() if c[0] == "numpy"]
    assert check == ("numpy", False, f"2.4.6 installed, but torch cannot use it: {NUMPY_WARNING}")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_doctor_torch_prints_no_raw_warning_for_real():
    code = ("import sys; sys.modules['numpy'] = None\n"  # numpy unimportable: torch warns on import
            "from gputop.cli import main; sys.exit(main(['doctor', '--torch']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "Failed to initialize NumPy" not in proc.stderr and "UserWarning" not in proc.stderr, proc.stderr
    assert any(line.split()[1:2] == ["numpy"] for line in proc.stdout.splitlines()), proc.stdout


def test_a_machine_without_a_gpu_is_told_what_still_works(monkeypatch, capsys):
    import argparse

    import gputop.sources as sources

    ok = [("x", True, "fine")]
    monkeypatch.setattr(doctor, "python_checks", lambda: ok)
    monkeypatch.setattr(doctor, "ptrace_checks", lambda: ok)
    monkeypatch.setattr(doctor, "host_checks", lambda: ok)
    monkeypatch.setattr(sources, "describe_environment", lambda: [("NVIDIA driver", False, "not loaded")])
    assert doctor.run(argparse.Namespace(torch=False)) == 1  # still a problem found
    out = capsys.readouterr().out
    assert "1 problem found." in out and doctor.WITHOUT_GPU in out
    # another problem beside the GPU's: that one is the news, not what works without a GPU
    monkeypatch.setattr(doctor, "host_checks", lambda: [("/dev/shm", False, "64 MiB")])
    assert doctor.run(argparse.Namespace(torch=False)) == 1
    assert doctor.WITHOUT_GPU not in capsys.readouterr().out
