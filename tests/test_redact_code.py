"""Secrets in the source lines of stack frames (``connect(api_key="sk-…")``): hidden on every path
that shows or keeps a frame's code, the way command lines are. Redacted once where py-spy's output
is parsed (``StackParser``), again by the writer and again by the reader (a recording made before
source lines were redacted), so ``stacks``, ``stacks --json``, the Stacks pane, the file and a
replay never hold them; and cheap, since the same lines come back in every sample."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gputop.ui.pane import PaneContext
from gputop.analysis.classify import classify, is_library
from gputop.analysis.views import ViewsStage
from gputop.model import Frame, StackSample
from gputop.present.stacks import plain
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.redact import MAX_CODE_CHARS, REDACTED, redact_code
from gputop.sources.stacks import StackParser
from gputop.store import Store

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600.0

# The line: a token by shape and by name, a password in a URL.
SECRET_LINE = 'connect(api_key="sk-proj-CODESECRET1abcdefgh2", url="https://bob:CODESECRET2@host/x")'
SECRETS = ["CODESECRET"]


def _no_secret(text: str, where: str) -> None:
    for s in SECRETS:
        assert s not in text, (where, text[:2000])


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("line, shown", [
    (SECRET_LINE, 'connect(api_key="***", url="https://bob:***@host/x")'),
    ('cfg["password"] = "hunter2"', 'cfg["password"] = "***"'),
    ('os.environ["WANDB_API_KEY"] = "0a1b2c3d"', 'os.environ["WANDB_API_KEY"] = "***"'),
    ('headers = {"Authorization": "Bearer abc.def"}', 'headers = {"Authorization": "***"}'),
    ("creds = {'secret': 'xyz', 'user': 'bob'}", "creds = {'secret': '***', 'user': 'bob'}"),
    ('api_key: str = "xyz123"', 'api_key: str = "***"'),
    ('def login(user, password: str = "dflt"):', 'def login(user, password: str = "***"):'),
    ('requests.get(url, auth=("bob", "s3cret"))', 'requests.get(url, auth=("***", "***"))'),
    ('self.token = "abc" if x else None', 'self.token = "***" if x else None'),
    ('PASSWORD = """hunter2"""', 'PASSWORD = """***"""'),
    ('pin = 1234  # password: hunter2', 'pin = 1234  # password: ***'),
    ('db = psycopg2.connect("host=db user=bob password=hunter2")',
     'db = psycopg2.connect("host=db user=bob password=***")'),
    ('login(key="0123456789abcdef0123456789abcdef01234567")', 'login(key="***")'),
    ('hf_hub_download(repo, token="hf_AbCdEfGhIjKlMnOpQrStUvWx")', 'hf_hub_download(repo, token="***")'),
    ('s3 = boto3.client("s3", aws_access_key_id=k, region="AKIAQWERTYUIOPASDFGH")',
     's3 = boto3.client("s3", aws_access_key_id=k, region="***")'),
    # a new user's: an abbreviated password name went through in clear
    ('PASSWD = "HUNTER5PASS"; DB_PW = "HUNTER6PASS"', 'PASSWD = "***"; DB_PW = "***"'),
    ("smtp_pw: str = 'x1y2'", "smtp_pw: str = '***'"),
    # a new user's: a command line written in the code kept its option's value in clear
    ('cmd = "huggingface-cli login --token hf_abc123secret"; time.sleep(0.1)',
     'cmd = "huggingface-cli login --token ***"; time.sleep(0.1)'),
    ('subprocess.run(["huggingface-cli", "login", "--token", "hf_abc123secret"])',
     'subprocess.run(["huggingface-cli", "login", "--token", "***"])'),
    ("os.system('wandb login --api-key ABC123XYZ --relogin')  # or --password PW9",
     "os.system('wandb login --api-key *** --relogin')  # or --password ***"),
])
def test_secrets_in_a_source_line_are_hidden(line, shown):
    assert redact_code(line) == shown
    assert redact_code(shown) == shown  # idempotent: the reader's pass changes nothing more


@pytest.mark.parametrize("line", [
    'client = Client(token=os.environ["HF_TOKEN"])',  # where the secret comes from, not the secret
    'db = connect(user="bob", password=os.getenv("PW"))',
    "self.secret_key = config.secret_key",
    "key = jax.random.PRNGKey(0)",
    "pwd = os.getcwd()",
    'session.headers["X-Api-Key"] = api_key',
    "loss = model(input_ids, max_tokens=32)",
    'enc = tokenizer(text, return_tensors="pt", pad_token_id=0)',
    "sorted(items, key=lambda kv: kv[1])",
    'print("token:", token)',
    'token = ""',
    'open("/data/token_cache.json")',
    "outputs = model(**batch); loss = outputs.loss",
    "loss.item()",
    'if key == "labels":',  # comparisons are kept: a collator's keys, not secrets
    'if password != "":',
    'self.conv_pw = nn.Conv2d(c, c, 1, groups=1)',  # a pointwise convolution, not a password
    "x_pw = pw_conv(x); upward = 'up'",
    'parser.add_argument("--token", "-t", default=None)',  # an option declared, no value in it
    'subprocess.run(["train.py", "--use_auth_token", "--max-tokens", "5"])',
    "return -key if reverse else key",  # code, not a command line
])
def test_ordinary_code_is_kept(line):
    assert redact_code(line) == line


def test_a_long_line_is_cut_between_words_so_no_part_of_a_token_shows():
    token = "sk-proj-" + "A1" * 600  # straddles the cut
    line = "x = f(" + ", ".join(f"arg{i}={i}" for i in range(80)) + f', api_key="{token}")'
    out = redact_code(line)
    assert len(out) <= MAX_CODE_CHARS + 2 and out.endswith(" …")
    assert "A1A1" not in out and "sk-proj" not in out


def test_a_line_seen_before_is_not_judged_again_and_a_long_line_is_cut_first():
    """What keeps redacting source lines cheap (its cost is bench/redact_cost.py's, measured, not
    timed here): the parser meets the same few lines in every sample, so a line seen before is a
    cache hit, not a second judgement; and a line is cut to MAX_CODE_CHARS before it is judged."""
    from gputop.redact import _judge_code

    lines = [ln.strip() for ln in (ROOT / "gputop" / "record" / "writer.py").read_text().splitlines() if ln.strip()]
    lines = list(dict.fromkeys(lines))[:300]
    _judge_code.cache_clear()
    for ln in lines:
        redact_code(ln)
    misses = _judge_code.cache_info().misses
    for _ in range(3):
        for ln in lines:
            redact_code(ln)
    info = _judge_code.cache_info()
    assert info.misses == misses and info.hits >= 3 * len(lines)
    long_line = "x = f(" + ", ".join(f'token{i}="v{i}"' for i in range(20_000)) + ")"
    judged: list[str] = []
    raw = _judge_code.__wrapped__
    import gputop.redact as redact_module

    def spy(line):
        judged.append(line)
        return raw(line)

    original = redact_module._judge_code
    redact_module._judge_code = spy
    try:
        out = redact_code(long_line)
    finally:
        redact_module._judge_code = original
    assert judged and all(len(j) <= MAX_CODE_CHARS + 2 for j in judged)
    assert len(out) <= MAX_CODE_CHARS + 2


# --------------------------------------------------------------------------- live: the parser


def _dump(filename: str, lines: int = 1) -> list[dict]:
    return [{"pid": 4242, "thread_id": 1, "thread_name": "MainThread", "os_thread_id": 4242, "active": True,
             "owns_gil": True,
             "frames": [{"name": f"f{k}", "filename": filename, "line": k + 1, "module": None} for k in range(lines)]}]


def test_the_parser_gives_frames_their_source_line_redacted():
    seen = []

    def lines(fn, ln):
        seen.append((fn, ln))
        return SECRET_LINE

    parser = StackParser(lines, classify, is_library)
    for k in range(5):
        (s,) = parser.samples(_dump("/home/u/proj/train.py"), T0 + k)
        assert s.frames[0].code == 'connect(api_key="***", url="https://bob:***@host/x")'
    assert len(seen) == 1  # read (and redacted) once: the frame is interned


# --------------------------------------------------------------------------- stacks --json, a real process


def test_stacks_json_of_a_real_process_hides_the_secret_in_its_source_line(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""\
        import time

        def connect(api_key, url):
            time.sleep(60)

        {SECRET_LINE}
    """))
    p = subprocess.Popen([sys.executable, str(script)], cwd=str(tmp_path))
    try:
        time.sleep(0.6)  # the interpreter up and in connect()
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run([sys.executable, "-m", "gputop", "stacks", "--pid", str(p.pid), "--json"],
                              capture_output=True, text=True, timeout=60, env=env, cwd=str(ROOT),
                              stdin=subprocess.DEVNULL)
    finally:
        p.kill()
        p.wait()
    if proc.returncode != 0 and "ptrace" in (proc.stderr + proc.stdout).lower():
        pytest.skip("py-spy cannot attach here: " + proc.stderr[-200:])
    assert proc.returncode == 0, proc.stderr
    _no_secret(proc.stdout + proc.stderr, "stacks --json")
    codes = [f["code"] for th in json.loads(proc.stdout)["threads"] for f in th["frames"] if f.get("code")]
    assert 'connect(api_key="***", url="https://bob:***@host/x")' in codes, codes


# --------------------------------------------------------------------------- the Stacks pane


async def test_the_stacks_pane_shows_the_line_redacted():
    from textual.app import App

    from gputop.ui.stacks_pane import StacksPane

    parser = StackParser(lambda fn, ln: SECRET_LINE, classify, is_library)
    store = Store()
    for k in range(10):
        store.add(parser.samples(_dump("/home/u/proj/train.py", 2), T0 + k * 0.2))
    store.add(ViewsStage(store, 4242, 30.0).poll())

    class Host(App):
        def compose(self):
            yield pane

    pane = StacksPane()
    async with Host().run_test(size=(160, 40)):
        pane.update_view(PaneContext(store, 4242))
        text = plain(pane.last_lines)
        rendered = pane.query_one("#stacks-body").plain
    _no_secret(text + rendered, "Stacks pane")
    assert 'api_key="***"' in text


# --------------------------------------------------------------------------- the recording


def _sample(code: str, ts: float = T0) -> StackSample:
    return StackSample(ts=ts, pid=4242, thread_id=1, thread_name="MainThread", is_main=True,
                       frames=(Frame("connect", "/home/u/proj/train.py", 6, None, code),))


def test_the_recording_holds_no_secret_even_from_a_source_that_missed_it(tmp_path):
    path = tmp_path / "r.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", host="h"))
    parsed = StackParser(lambda fn, ln: SECRET_LINE, classify, is_library).samples(_dump("/home/u/proj/a.py"), T0)
    w.flush([*parsed, _sample(SECRET_LINE, T0 + 1)])  # the second one unredacted: the writer's own pass
    w.finish()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    for s in SECRETS:
        assert s.encode() not in raw
    with Reader(path) as r:
        codes = {f.code for s in r.stack_samples(T0 - 1, T0 + 2) for f in s.frames}
    assert codes == {'connect(api_key="***", url="https://bob:***@host/x")'}


def test_an_old_recording_with_a_secret_in_a_frame_reads_redacted(tmp_path):
    """A recording made before source lines were redacted holds the line in clear: reading it
    (replay, report, the Stacks pane of a replay) hides it."""
    path = tmp_path / "old.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", host="h"))
    w.flush([_sample("connect()")])
    w.finish()
    con = sqlite3.connect(path)
    con.execute("UPDATE frames SET code = ?", (SECRET_LINE,))
    con.commit()
    con.close()
    assert b"CODESECRET" in path.read_bytes()  # the old file, as it was written
    with Reader(path) as r:
        (s,) = r.stack_samples(T0 - 1, T0 + 1)
        frames = r.frames_of(1)
    assert s.frames[0].code == 'connect(api_key="***", url="https://bob:***@host/x")'
    assert all(REDACTED in f.code for f in frames)


def test_an_old_recording_quoting_a_secret_line_in_a_finding_reads_redacted(tmp_path):
    """The rules quote frames' code in their evidence; an old file's evidence had only the
    free-text pass, which does not know the subscript form."""
    from gputop.model import Finding, Severity

    path = tmp_path / "old.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", host="h"))
    w.flush([Finding(id="x", title="t", severity=Severity.INFO, confidence=0.5, evidence=("e",), action="", ts=T0)])
    w.finish()
    con = sqlite3.connect(path)
    con.execute("UPDATE findings SET evidence = ?",
                (json.dumps(['main thread in `cfg["password"] = "CODESECRET3"` (train.py:3)']),))
    con.commit()
    con.close()
    with Reader(path) as r:
        (f,) = r.findings()
    assert f.evidence == ('main thread in `cfg["password"] = "***"` (train.py:3)',)
