"""Environment settings a script makes for itself (os.environ[...] = ... at its top), read from its
source: the process's /proc environment never shows them, and a held-out HF Trainer job that set
CUDA_LAUNCH_BLOCKING=1 this way was told launch-bound (unsetting it: 1.58x)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from gputop.model import SET_IN_SCRIPT, ProcSample
from gputop.sources.host import HostSource, job_env, read_script_settings
from gputop.sources.script_env import env_set_by_script, script_argv

from gputop.model import Category as C
from synth import Job, periodic, phases
from test_rules import HEALTHY_GPM, run_rules


def scan(src: str, argv=("train.py",), environ=None):
    return env_set_by_script(textwrap.dedent(src), list(argv), environ or {})


def test_module_level_assignment_with_its_line():
    src = """
    import os, sys
    # debugging aid
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    """
    assert scan(src) == (("CUDA_LAUNCH_BLOCKING", "1", 4), ("TOKENIZERS_PARALLELISM", "false", 5))


def test_a_test_on_argv_is_decided_by_the_process_argv():
    src = """
    import os, sys
    if "--no-launch-blocking" not in sys.argv:
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    """
    assert scan(src, ["t.py", "--batch", "32"]) == (("CUDA_LAUNCH_BLOCKING", "1", 4),)
    assert scan(src, ["t.py", "--no-launch-blocking"]) == ()


def test_a_test_on_the_environment_is_decided_by_the_starting_environment():
    src = """
    import os
    if os.environ.get("DEBUG") == "1" or "DEBUG_ALL" in os.environ:
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    else:
        os.environ["NCCL_DEBUG"] = "WARN"
    """
    assert scan(src, environ={"DEBUG": "1"}) == (("CUDA_LAUNCH_BLOCKING", "1", 4),)
    assert scan(src, environ={}) == (("NCCL_DEBUG", "WARN", 6),)


def test_an_undecidable_test_and_an_uncalled_function_are_not_taken():
    src = """
    import os
    def debug_mode():
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    if args.debug:
        os.environ["TORCH_USE_CUDA_DSA"] = "1"
    """
    assert scan(src) == ()


def test_main_called_under_the_name_guard_is_followed():
    src = """
    import os
    def main():
        os.environ.update({"CUDA_LAUNCH_BLOCKING": "1"})
        train()
    if __name__ == "__main__":
        main()
    """
    assert scan(src) == (("CUDA_LAUNCH_BLOCKING", "1", 4),)


def test_setdefault_keeps_a_value_the_environment_has():
    assert scan('import os\nos.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")\n', environ={"CUDA_LAUNCH_BLOCKING": "0"}) == ()


def test_unparsable_or_huge_sources_give_nothing():
    assert scan("def (:\n") == ()
    assert env_set_by_script("x = 1\n" * 400_000, ["t.py"], {}) == ()


@pytest.mark.parametrize("cmd,want", [
    (["/usr/bin/python3", "-u", "train.py", "--lr", "1"], ("train.py", ["train.py", "--lr", "1"])),
    (["python", "-X", "faulthandler", "/abs/t.py"], ("/abs/t.py", ["/abs/t.py"])),
    (["python3", "-m", "torch.distributed.run", "t.py"], None),
    (["torchrun", "t.py"], None),
    (["python3"], None),
])
def test_script_argv(cmd, want):
    assert script_argv(cmd) == want


def test_job_env_overrides_and_marks_only_performance_keys():
    env = dict(job_env({"CUDA_LAUNCH_BLOCKING": "0", "HOME": "/root"},
                       (("CUDA_LAUNCH_BLOCKING", "1", "t.py:4"), ("WANDB_API_KEY", "sk-abc", "t.py:5"))))
    assert env["CUDA_LAUNCH_BLOCKING"] == "1" and env["CUDA_LAUNCH_BLOCKING" + SET_IN_SCRIPT] == "t.py:4"
    assert not any("WANDB" in k for k in env)


def test_read_script_settings_resolves_a_relative_script_against_the_cwd(tmp_path):
    (tmp_path / "t.py").write_text('import os\nos.environ["CUDA_LAUNCH_BLOCKING"] = "1"\n')
    assert read_script_settings(["python3", "t.py"], str(tmp_path), {}) == (("CUDA_LAUNCH_BLOCKING", "1", "t.py:2"),)
    assert read_script_settings(["python3", "gone.py"], str(tmp_path), {}) == ()
    assert read_script_settings(["python3", "t.py"], None, {}) == ()


def test_a_real_process_that_sets_it_for_itself(tmp_path):
    """The host source reads the running script's own setting (not in /proc/PID/environ)."""
    script = tmp_path / "job.py"
    script.write_text('import os, time\nos.environ["CUDA_LAUNCH_BLOCKING"] = "1"\ntime.sleep(30)\n')
    p = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        time.sleep(0.3)
        src = HostSource(pids=lambda: [p.pid], target_pid=p.pid)
        procs = [s for s in src.poll() if isinstance(s, ProcSample) and s.pid == p.pid]
        env = dict(procs[0].env)
        assert env.get("CUDA_LAUNCH_BLOCKING") == "1"
        assert env.get("CUDA_LAUNCH_BLOCKING" + SET_IN_SCRIPT) == "job.py:2"
    finally:
        p.kill()
        p.wait()


def test_the_rule_names_the_scripts_line_and_outranks_launch_bound():
    job = Job(util=periodic(1.0, 0.5), main=phases(1.0, 0.5, C.HOST_SYNC, C.FORWARD), gpu=HEALTHY_GPM,
              env=(("CUDA_LAUNCH_BLOCKING", "1"), ("CUDA_LAUNCH_BLOCKING" + SET_IN_SCRIPT, "train.py:25")))
    f = run_rules(job)[0]["cuda-launch-blocking"]
    assert "train.py:25" in f.evidence[0] and "for itself" in f.evidence[0]
    assert f.action.startswith("delete the os.environ CUDA_LAUNCH_BLOCKING line at train.py:25")


def test_the_script_is_read_once_per_process_not_every_poll(tmp_path, monkeypatch):
    """The cache of a process's script settings lives as long as the process is watched: a poll
    that dropped it for every process read and parsed the target's script on every poll."""
    import gputop.sources.host as host

    reads = []
    real = host.read_script_settings

    def counting(cmdline, cwd, environ):
        reads.append(cmdline)
        return real(cmdline, cwd, environ)

    monkeypatch.setattr(host, "read_script_settings", counting)
    script = tmp_path / "job.py"
    script.write_text('import os, time\nos.environ["CUDA_LAUNCH_BLOCKING"] = "1"\ntime.sleep(30)\n')
    p = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        time.sleep(0.3)
        src = HostSource(pids=lambda: [p.pid], target_pid=p.pid)
        for _ in range(3):
            src.poll()
        assert len(reads) == 1
    finally:
        p.kill()
        p.wait()
