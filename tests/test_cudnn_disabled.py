"""cuDNN turned off in the job's code (`torch.backends.cudnn.enabled = False`, a seeding helper's
"reproducibility"): read from the source once per file, carried by its frames, recorded, and named
only when the stacks show the convolutions taking the main thread's time (the line may sit under a
flag that did not run)."""

from gputop.model import Category as C
from gputop.model import Frame
from gputop.sources.loop_source import cudnn_off_line

from synth import Job
from test_rules import run_rules

SITE = "/venv/lib/python3.12/site-packages"
SEED = '''import torch
from torch.backends import cudnn

def seed_everything(seed, keep_cudnn=False):
    torch.manual_seed(seed)
    if not keep_cudnn:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.enabled = False
'''


def test_the_line_turning_cudnn_off_is_read_from_the_source():
    assert cudnn_off_line(SEED) == 8
    assert cudnn_off_line("from torch.backends import cudnn\ncudnn.enabled = False\n") == 2
    # On, benchmark, deterministic, or not Python: nothing.
    assert cudnn_off_line("import torch\ntorch.backends.cudnn.enabled = True\n") == 0
    assert cudnn_off_line("import torch\ntorch.backends.cudnn.benchmark = False\n") == 0
    assert cudnn_off_line("def f(:\n") == 0


def test_the_fact_is_recorded_with_the_frame():
    from gputop.record.codec import keeps_text, loop_fields

    f = Frame("main", "/home/u/train.py", 124, cudnn_off=62)
    assert loop_fields(keeps_text(f))["cudnn_off"] == 62
    assert loop_fields('{"loop": 0, "keeps": [], "cudnn_off": -3}')["cudnn_off"] == 0  # foreign: none
    assert loop_fields(None)["cudnn_off"] == 0


def conv_job(cudnn_off: int, conv_share: float):
    conv = (Frame("Conv2d._conv_forward", f"{SITE}/torch/nn/modules/conv.py", 548),
            Frame("Conv2d.forward", f"{SITE}/torch/nn/modules/conv.py", 553),
            Frame("main", "/home/u/train.py", 124, cudnn_off=cudnn_off))
    bwd = (Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 869),
           Frame("main", "/home/u/train.py", 125, cudnn_off=cudnn_off))

    def in_conv(t):
        return (t * 10) % 10 < conv_share * 10

    return Job(seconds=20.0, util=lambda t: 80.0, main=lambda t: C.FORWARD if in_conv(t) else C.BACKWARD,
               main_frames=lambda t: conv if in_conv(t) else bwd, main_active=in_conv,
               gpu={"sm_active": 40.0, "tensor_active": 2.0})


def test_cudnn_off_with_the_main_thread_in_conv_calls_is_named_with_its_line():
    found, _ = run_rules(conv_job(cudnn_off=62, conv_share=0.3))
    f = found["cudnn-disabled"]
    assert f.title.startswith("cuDNN is turned off (") and "train.py:62)" in f.title, f.title
    assert "remove `torch.backends.cudnn.enabled = False`" in f.action and "deterministic = True" in f.action
    # The thread's 40 % inside the calls goes at least (5 Hz samples land on 2 of each 5 tenths).
    assert f.expected_gain.startswith("at least 1.7x") and f.gain_predicted is None


def test_the_line_without_conv_calls_on_the_thread_is_not_enough():
    # The flag's other branch ran (cuDNN on): a launch returns at once, the thread is rarely inside.
    found, _ = run_rules(conv_job(cudnn_off=62, conv_share=0.1))
    assert "cudnn-disabled" not in found
    # ...and conv calls without the line are not this finding.
    found, _ = run_rules(conv_job(cudnn_off=0, conv_share=0.3))
    assert "cudnn-disabled" not in found


def test_the_source_reader_gives_the_fact_to_the_files_frames(tmp_path):
    from gputop.sources.pyspy_parser import SourceLines

    path = tmp_path / "train.py"
    import os

    path.write_text(SEED + "\nfor step in range(10):\n    loss = step\n")
    os.utime(path, (0, 0))  # older than the "job": a file changed since it started is not read

    src = SourceLines(os.getpid())
    facts = src.facts(str(path), 11)
    assert facts.cudnn_off == 8


def test_a_cpu_job_with_the_line_is_not_told():
    # No GPU: cuDNN is not used, and a conv net on the CPU computes inside its conv calls.
    from dataclasses import replace

    found, _ = run_rules(replace(conv_job(cudnn_off=62, conv_share=0.3), gpus=0))
    assert "cudnn-disabled" not in found
