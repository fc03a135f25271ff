"""The line a leak comes from, read from the loop the stacks show: a `total_loss += loss` runs for
microseconds and is almost never sampled, the loop around the sampled line is (sources.loop_source
reads what it keeps; analysis.memory_cause judges it; memory-growth names it; a recording keeps it)."""

from __future__ import annotations

import sqlite3

from gputop.analysis import leak_lines
from gputop.model import Frame, Severity, StackSample
from gputop.sources.loop_source import keeps_at, loops_of
from gputop.sources.pyspy_parser import SourceLines, StackParser

from synth import T0, GiB, Job, rule_findings
from test_memory_growth import GPM, MiB, _loop_frames

TRAIN = '''\
import collections, torch
history = []
recent = collections.deque(maxlen=10)
cache = {}
buf = torch.zeros(1000)
total_loss = 0.0
for step, (x, y) in enumerate(loader):
    outs = []
    for block in blocks:
        outs.append(block(x))  # the turn's own list
    loss = model(x).sum()
    total_loss += loss
    history.append(loss.item())
    recent.append(loss)
    buf[step] = loss.detach()
    cache[step] = x.detach()  # never trimmed
    seen = {}
    seen[step] = x
    step += 1
'''


def test_a_loop_keeps_what_it_adds_to_every_turn_and_never_takes_from():
    loops = loops_of(TRAIN)
    kept = dict(keeps_at(loops, 11))  # the sampled line: the forward
    assert kept == {12: "total_loss += loss", 13: "history.append(loss.item())", 16: "cache[step] = x.detach()"}
    # the inner loop keeps its turn's list (made afresh each outer turn, but kept across the inner one)
    assert dict(keeps_at(loops, 10)) == {10: "outs.append(block(x))"}
    assert keeps_at(loops, 2) == ()  # no loop there


def test_what_the_loop_takes_from_or_bounds_is_not_kept():
    src = "q = []\nd = {}\nfor i in range(9):\n    q.append(i)\n    q.pop(0)\n    d[i] = i\n    del d[i - 1]\n"
    assert keeps_at(loops_of(src), 4) == ()


def test_unparsable_source_reads_no_loops():
    assert loops_of("for x in :\n  pass\n") is None
    assert keeps_at(None, 3) == ()


def test_the_parser_gives_the_users_frames_their_loops_keepers(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN.replace("cache[step] = x.detach()", "cache[step] = x.detach(); token = 'hf_abcdefghijklmnopqrstuvwxyz12'"))
    import os

    os.utime(path, (0, 0))  # written before the process (pid 1) started: its lines are the running code's
    src = SourceLines(1)
    parser = StackParser(src.line, is_library=lambda f: "site-packages" in f, facts=src.facts)
    raw = [{"thread_id": 1, "frames": [{"name": "forward", "filename": "/x/site-packages/torch/nn/m.py", "line": 3},
                                       {"name": "<module>", "filename": str(path), "line": 11}]}]
    own = parser.samples(raw, 0.0)[0].frames[1]
    assert (12, "total_loss += loss") in own.keeps
    assert all("hf_abc" not in code for _, code in own.keeps)  # redacted like every source line
    assert parser.samples(raw, 0.0)[0].frames[0].keeps == ()  # a library's frame: not read
    # with the reader of freed keepers (what the stack source passes): none here (no backward)
    parser = StackParser(src.line, is_library=lambda f: "site-packages" in f, facts=src.facts)
    assert parser.samples(raw, 0.0)[0].frames[1].freed == ()
    path.write_text(BOTH)
    os.utime(path, (0, 0))
    src = SourceLines(1)
    parser = StackParser(src.line, is_library=lambda f: "site-packages" in f, facts=src.facts)
    raw = [{"thread_id": 1, "frames": [{"name": "<module>", "filename": str(path), "line": 11}]}]
    assert parser.samples(raw, 0.0)[0].frames[0].freed == (9,)


def _main(frames, n=40):
    return [StackSample(ts=float(k), pid=1, thread_id=1, frames=frames, is_main=True) for k in range(n)]


def test_leak_lines_read_the_training_loops_keepers_after_what_a_sample_caught():
    keeps = ((12, "total_loss += loss"), (16, "cache[step] = x.detach()"))
    loop = Frame("<module>", "/home/u/train.py", 11, code="loss = model(x).sum()", keeps=keeps)
    got = leak_lines(_main((loop,)), ("<module>", "u/train.py"))
    assert [(g.where, g.graph, g.read) for g in got] == [("u/train.py:12", True, True), ("u/train.py:16", False, True)]
    assert "loss.item()" in got[0].fix and "bound `cache`" in got[1].fix
    # without the step's loop known, a frame's keepers are not the step's
    assert leak_lines(_main((loop,)), None) == ()
    # keepers of another frame's loop (a model's layers) are not the step's either
    assert leak_lines(_main((loop,)), ("forward", "u/model.py")) == ()


def test_memory_growth_names_the_keeper_of_the_loop_the_stacks_show():
    def frames(t):
        fs = list(_loop_frames(t))
        fs[1] = Frame("train", "/home/u/train.py", fs[1].line, code="x", keeps=((57, "losses.append(loss)"),))
        return tuple(fs)
    job = Job(seconds=150, gpu={**GPM, "mem_used": lambda t: 4 * GiB + 50 * MiB * t},
              proc_mem=lambda t: 4 * GiB + 50 * MiB * t, main_frames=frames)
    found, _ = rule_findings(job)
    f = found["memory-growth"]
    assert f.severity is Severity.WARNING and f.confidence >= 0.85
    assert any("u/train.py:57: `losses.append(loss)`, in the training loop the stacks show (read from its source), "
               "keeps each step's tensor with its autograd graph" in e for e in f.evidence)
    assert f.action.startswith("u/train.py:57: losses.append(loss)  →  append loss.detach()")


def test_a_recording_keeps_the_keepers_and_appends_to_a_file_without_them(tmp_path):
    from gputop.record.reader import Reader
    from gputop.record.writer import RecordWriter, SessionMeta

    keeps = ((12, "total_loss += loss"), (16, "cache[step] = x.detach()"))
    frame = Frame("<module>", "/home/u/train.py", 11, code="loss = model(x).sum()", keeps=keeps)
    path = tmp_path / "a.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(host="h"))
    w.flush([StackSample(ts=T0 + 1, pid=7, thread_id=1, frames=(frame,), is_main=True)])
    w.finish()
    assert Reader(path).stack_samples(0, 2e9)[0].frames[0].keeps == keeps
    # a file from before the column: read with none, appended to with the column added
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE f2 (id INTEGER PRIMARY KEY, name TEXT, filename TEXT, line INTEGER, module TEXT, code TEXT)")
    con.execute("INSERT INTO f2 SELECT id, name, filename, line, module, code FROM frames")
    con.execute("DROP TABLE frames")
    con.execute("ALTER TABLE f2 RENAME TO frames")
    con.commit()
    con.close()
    assert Reader(path).stack_samples(0, 2e9)[0].frames[0].keeps == ()
    w = RecordWriter.create(path, append=True)
    w.start_session(SessionMeta(host="h"))
    w.flush([StackSample(ts=T0 + 5, pid=7, thread_id=1, frames=(frame,), is_main=True)])
    w.finish()
    got = [s.frames[0].keeps for s in Reader(path).stack_samples(0, 2e9)]
    assert got == [(), keeps]
    # a foreign column's garbage reads as none
    con = sqlite3.connect(path)
    con.execute("UPDATE frames SET keeps = '{\"loop\": -3, \"keeps\": [[1, 2], \"x\", {}]}'")
    con.commit()
    con.close()
    assert all(s.frames[0].keeps == () for s in Reader(path).stack_samples(0, 2e9))


def _module(line, loop, code="x"):
    return (Frame("<module>", "/home/u/val.py", line, code=code, loop=loop),)


def test_a_loop_that_sleeps_most_of_the_time_is_known_from_one_sample_of_its_work():
    from gputop.model import Category as C

    # a validation loop (line 27) that keeps its losses' graphs and waits on its data 99 % of the
    # time: one forward sample in 30 s tells the loop, and growth since the loop began is judged
    def frames(t):
        return _module(29, 27) if int(t * 5) == 60 else _module(31, 27)

    def category(t):
        return C.FORWARD if int(t * 5) == 60 else C.DATA_WAIT

    mem = lambda t: 20 * GiB + 400 * MiB * t  # noqa: E731
    found, ctx = rule_findings(Job(seconds=26, main=category, main_frames=frames, gpu={**GPM, "mem_used": mem},
                                   proc_mem=mem))
    assert ctx.step.loop_at == ("<module>", "u/val.py")
    assert "memory-growth" in found


def test_growth_in_a_loading_loop_of_the_same_function_is_not_the_training_loops():
    from gputop.model import Category as C

    # one module-level script: a loop loading shards (line 21, 16 s, memory rising), then the
    # training loop (line 30, flat): the training loop began at 16 s, so at 28 s there are 12 s of it
    def frames(t):
        return _module(22, 21) if t < 16 else _module(32, 30)

    def category(t):
        return C.OTHER if t < 16 else (C.FORWARD, C.BACKWARD, C.OPTIMIZER)[int(t * 5) % 3]

    mem = lambda t: 20 * GiB + 1000 * MiB * min(t, 16.0)  # noqa: E731
    for seconds in (24, 30, 40):
        found, ctx = rule_findings(Job(seconds=seconds, main=category, main_frames=frames,
                                       gpu={**GPM, "mem_used": mem}, proc_mem=mem))
        assert ctx.step.stepping
        assert "memory-growth" not in found, seconds


STEP_FN = '''\
feature_cache = {}
class Trainer:
    def __init__(self):
        self.history = []
    def step(self, x, step):
        out = model(x)
        self.history.append(out)
        outs = []
        for block in blocks:
            outs.append(block(out))
        return out.sum()

def train_step(x, step):
    h = model(x)
    feature_cache[step] = h[:48].detach().clone()
    tmp = {}
    tmp[step] = h
    return h.sum()
'''


def test_a_step_function_called_from_the_loop_keeps_what_it_adds_to_beyond_the_call():
    loops = loops_of(STEP_FN)
    assert dict(keeps_at(loops, 6)) == {7: "self.history.append(out)"}  # Trainer.step
    assert dict(keeps_at(loops, 14)) == {15: "feature_cache[step] = h[:48].detach().clone()"}  # not tmp[step]
    assert dict(keeps_at(loops, 10)) == {10: "outs.append(block(out))"}  # the function's own loop


def test_leak_lines_read_the_keepers_of_a_function_the_training_loop_calls():
    loop = Frame("train", "/home/u/train.py", 40, keeps=(), loop=38)
    step = Frame("Trainer.step", "/home/u/trainer.py", 6, keeps=((7, "self.history.append(out)"),), loop=0)
    layer = Frame("Block.forward", "/home/u/model.py", 10, keeps=((10, "outs.append(block(out))"),), loop=9)
    got = leak_lines(_main((layer, step, loop)), ("train", "u/train.py"))
    assert [(g.where, g.code, g.called) for g in got] == [("u/trainer.py:7", "self.history.append(out)", "Trainer.step")]


def test_a_file_edited_after_the_job_started_shows_no_lines(tmp_path):
    import os
    import time

    path = tmp_path / "edited.py"
    path.write_text("while True:\n    time.sleep(1)\n")
    src = SourceLines(os.getpid())  # this process started before the file was written
    assert src.line(str(path), 2) is None and src.loop(str(path), 2) == (0, ())
    assert src.stale == [str(path)]
    old = time.time() - 10 * 365 * 86400
    os.utime(path, (old, old))  # written before the process started: read
    assert SourceLines(os.getpid()).line(str(path), 2) == "time.sleep(1)"


def test_a_file_named_like_a_secret_keeps_its_line_number_in_text():
    from gputop.redact import redact_text

    assert redact_text("jobs/leak_secret.py:13: `seen.append(out)`") == "jobs/leak_secret.py:13: `seen.append(out)`"
    assert redact_text("credentials_loader.py:12") == "credentials_loader.py:12"
    # a secret's value stays hidden, digits or not
    assert redact_text("secret: 12345") == "secret: ***" and redact_text("--password=1234") == "--password=***"
    assert redact_text("secret.py=1234") == "secret.py=***"


def test_a_file_that_does_not_parse_is_noted_not_fatal(tmp_path):
    import os

    path = tmp_path / "broken.py"
    path.write_text("losses = []\nwhile True:\n    losses.append(loss)\ndef unrelated(:\n    pass\n")
    os.utime(path, (0, 0))
    src = SourceLines(1)
    assert src.loop(str(path), 3) == (0, ()) and src.line(str(path), 3) == "losses.append(loss)"
    assert src.unparsed == [str(path)]


def test_memory_growth_says_the_step_function_a_keeper_is_in():
    def frames(t):
        fs = list(_loop_frames(t))
        step = Frame("train_step", "/home/u/train.py", 20, code="h = model(x)",
                     keeps=((22, "feature_cache[step] = h.detach().clone()"),), loop=0)
        return (step, *fs[1:]) if int(t * 7) % 3 == 0 else tuple(fs)
    job = Job(seconds=150, gpu={**GPM, "mem_used": lambda t: 4 * GiB + 50 * MiB * t},
              proc_mem=lambda t: 4 * GiB + 50 * MiB * t, main_frames=frames)
    f = rule_findings(job)[0]["memory-growth"]
    assert any("`feature_cache[step] = h.detach().clone()`, in `train_step`, which the training loop calls every "
               "step (read from its source), adds to `feature_cache` every step, and nothing in the function takes "
               "from it" in e for e in f.evidence)


# A new user's job (leak.py): the training step's loss summed after its backward, and a validation
# loss summed with its whole forward's graph. Measured alone over 25 s on CPU: the first line grew
# the job's RSS 5 MB, the second 340 MB; the first was named, and `.item()` on it promised the job
# would finish.
BOTH = '''\
import torch
total_loss = 0; val_total = 0
def train_step():
    out = m(X); loss = nn.functional.cross_entropy(out, Y)
    opt.zero_grad(); loss.backward(); opt.step()
    return loss
while True:
    loss = train_step()
    total_loss += loss
    val_total += nn.functional.cross_entropy(m(Xv), Yv)
    time.sleep(0.01)
'''


def test_a_sum_of_losses_a_backward_ran_on_is_read_as_freed():
    from gputop.sources.loop_source import freed_at

    loops = loops_of(BOTH)
    assert dict(keeps_at(loops, 11)) == {9: "total_loss += loss", 10: "val_total += nn.functional.cross_entropy(m(Xv), Yv)"}
    assert freed_at(loops, 11) == (9,)  # train_step returns the loss it ran backward on
    # in the loop itself, through a scaler or accelerate; kept graph (retain_graph) or another tensor: not freed
    src = ("for x, y in dl:\n    out = model(x)\n    loss = crit(out, y)\n    scaler.scale(loss).backward()\n"
           "    losses.append(loss)\n    outs.append(out)\n    accelerator.backward(l2)\n    t2 += l2\n"
           "    l3.backward(retain_graph=True)\n    t3 += l3\n")
    loops = loops_of(src)
    assert [ln for ln, _ in keeps_at(loops, 2)] == [5, 6, 8, 10] and freed_at(loops, 2) == (5, 8)


def test_the_line_that_keeps_a_graph_no_backward_freed_is_named_first():
    keeps = ((9, "total_loss += loss"), (10, "val_total += nn.functional.cross_entropy(m(Xv), Yv)"))
    loop = Frame("<module>", "/home/u/leak.py", 11, code="time.sleep(0.01)", keeps=keeps, freed=(9,))
    got = leak_lines(_main((loop,)), ("<module>", "u/leak.py"))
    assert [(g.where, g.graph, g.freed) for g in got] == [("u/leak.py:10", True, False), ("u/leak.py:9", True, True)]
    assert got[0].fix.endswith("→  val_total += nn.functional.cross_entropy(m(Xv), Yv).item() (and a forward that no "
                               "backward follows under torch.no_grad(): it keeps no graph at all)"), got[0].fix
    # the freed sum alone: named, but as keeping little, with how to find the rest
    alone = Frame("<module>", "/home/u/leak.py", 11, code="time.sleep(0.01)", keeps=keeps[:1], freed=(9,))
    assert [g.freed for g in leak_lines(_main((alone,)), ("<module>", "u/leak.py"))] == [True]


def test_memory_growth_does_not_promise_a_freed_sum_is_the_fix():
    def frames(t):
        fs = list(_loop_frames(t))
        fs[1] = Frame("train", "/home/u/train.py", fs[1].line, code="x", keeps=((57, "total_loss += loss"),),
                      freed=(57,))
        return tuple(fs)
    job = Job(seconds=150, gpu={**GPM, "mem_used": lambda t: 4 * GiB + 50 * MiB * t},
              proc_mem=lambda t: 4 * GiB + 50 * MiB * t, main_frames=frames)
    found, _ = rule_findings(job)
    f = found["memory-growth"]
    assert f.confidence < 0.85
    assert any("keeps each step's `loss` after its backward: backward freed the activations its graph held" in e
               for e in f.evidence), f.evidence
    assert f.action.startswith("u/train.py:57: total_loss += loss  →  loss.item()")
    assert "it keeps little, so if memory still grows: find what is kept across steps" in f.action


def test_a_recording_keeps_which_keepers_were_freed(tmp_path):
    from gputop.record.reader import Reader
    from gputop.record.writer import RecordWriter, SessionMeta

    keeps = ((9, "total_loss += loss"), (10, "val_total += crit(m(Xv), Yv)"))
    frame = Frame("<module>", "/home/u/leak.py", 11, code="time.sleep(0.01)", keeps=keeps, loop=7, freed=(9,))
    path = tmp_path / "f.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(host="h"))
    w.flush([StackSample(ts=T0 + 1, pid=7, thread_id=1, frames=(frame,), is_main=True)])
    w.finish()
    got = Reader(path).stack_samples(0, 2e9)[0].frames[0]
    assert (got.keeps, got.loop, got.freed) == (keeps, 7, (9,))
    # appended to: the same frame is the same row (its freed lines part of its identity)
    w = RecordWriter.create(path, append=True)
    w.start_session(SessionMeta(host="h"))
    w.flush([StackSample(ts=T0 + 5, pid=7, thread_id=1, frames=(frame,), is_main=True)])
    w.finish()
    import sqlite3 as _sq
    assert _sq.connect(path).execute("SELECT count(*) FROM frames").fetchone()[0] == 1
