"""The exporter's per-rank series for a distributed job: identity from the environment (never a
secret), phases, hot line, stuck state and findings, read back through the exposition format."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gputop.export.job_collector import JobCollector  # noqa: E402
from gputop.model import Category, Finding, Frame, GpuProcess, GpuSample, ProcSample, Severity, StackSample, Verdict  # noqa: E402
from gputop.sources.job_identity import identity_of  # noqa: E402
from gputop.store import Store  # noqa: E402

from synth import T0, stack  # noqa: E402

SECRETS = ("hf_abcdefghijklmnopqrstuvwxyz0123456789", "s3cr3t-pa55w0rd-value", "AKIAIOSFODNN7EXAMPLE")
PIDS = {0: 5100, 1: 5101, 2: 5102, 3: 5103}


def environ(rank: int, **extra: str) -> dict[str, str]:
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4", "MASTER_ADDR": "node-a",
        "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
        "HF_TOKEN": SECRETS[0], "DB_PASSWORD": SECRETS[1], "AWS_ACCESS_KEY_ID": SECRETS[2],
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567", "PATH": "/usr/bin", **extra,
    }


# The straggler's own line carries a secret literal: the export must show the place, not the secret.
DECODE = (Frame("decode", "/home/u/data.py", 88, code=f'img = decode(buf, api_key="{SECRETS[1]}")'),
          Frame("train", "/home/u/train.py", 40))


def four_ranks(seconds: float = 20.0, stuck_rank: int | None = None) -> Store:
    """Rank 1 decodes data in its main thread; the other three wait for it in all_reduce. With
    ``stuck_rank``, that rank stands in one place for the whole window instead."""
    store = Store()
    # one NVML poll: each rank holds its own GPU (the findings are per GPU)
    store.add([*(GpuSample(T0, r, util_gpu=50.0) for r in range(4)),
               *(GpuProcess(T0, r, PIDS[r], used_memory=1 << 30) for r in range(4))])
    out: list[object] = []
    for k in range(int(seconds * 5)):
        t = T0 + k * 0.2
        for r, pid in PIDS.items():
            if r == stuck_rank:
                out.append(stack(t, Category.OTHER, pid=pid, active=False,
                                 frames=(Frame("wait_forever", "/home/u/train.py", 66),)))
            elif r == 1:
                cat = Category.DATA_FETCH if k % 5 else Category.FORWARD
                out.append(stack(t, cat, pid=pid, frames=DECODE if cat is Category.DATA_FETCH else None))
            else:
                cat = Category.COLLECTIVE if k % 5 < 3 else Category.BACKWARD
                out.append(stack(t, cat, pid=pid))
        for r, pid in PIDS.items():
            out.append(ProcSample(t, pid, ppid=5000, name="python", cmdline="python train.py"))
    store.add(out)
    f = Finding("data-starved", "GPU 1 waits for data", Severity.CRITICAL, 0.9, ("e",), "num_workers=8",
                cost_s=11.0, gpu_index=1)
    store.add([Verdict(store.now, (f,))])
    return store


def scrape(store, identify) -> tuple[str, dict[str, list]]:
    col = JobCollector(store, attached=lambda: list(PIDS.values()), identify=identify, window=20.0,
                       stuck_after=5.0, clock=lambda: store.now)
    reg = CollectorRegistry()
    reg.register(col)
    text = generate_latest(reg).decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return text, out


def identify_on(hosts: dict[int, str], **extra):
    rank_of = {p: r for r, p in PIDS.items()}
    return lambda pid: identity_of(environ(rank_of[pid], **extra), hosts[rank_of[pid]], launcher_pid=5000)


def test_every_rank_of_the_job_under_one_job_id_with_host_and_phases():
    text, m = scrape(four_ranks(), identify_on({0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}))
    info = {s.labels["rank"]: s.labels for s in m["gputop_rank_info"]}
    assert set(info) == {"0", "1", "2", "3"}
    assert {v["job_id"] for v in info.values()} == {"node-a:29500"}  # torchrun's "none" run id skipped
    assert {v["job_source"] for v in info.values()} == {"master"}
    assert info["2"]["host"] == "node-b" and info["2"]["world_size"] == "4" and info["3"]["local_rank"] == "1"
    phases = {(s.labels["rank"], s.labels["phase"]): s.value for s in m["gputop_rank_phase_ratio"]}
    assert {p for _, p in phases} == {"compute", "data", "comm", "ckpt", "other"}
    assert phases[("1", "data")] == pytest.approx(0.8, abs=0.05)
    assert phases[("0", "comm")] == pytest.approx(0.6, abs=0.05)
    wait = {s.labels["rank"]: s.value for s in m["gputop_rank_wait_ratio"]}
    assert wait["1"] < 0.1 and min(wait["0"], wait["2"], wait["3"]) > 0.5
    hot = {s.labels["rank"]: s.labels for s in m["gputop_rank_hot_line"]}
    assert len(m["gputop_rank_hot_line"]) == 4  # one series per rank
    assert hot["1"]["place"] == "decode (u/data.py:88)" and "decode(buf" in hot["1"]["code"] and "***" in hot["1"]["code"]
    assert hot["0"]["collective"] == "all_reduce"
    assert {s.labels["rank"]: s.value for s in m["gputop_rank_stuck"]} == {r: 0 for r in "0123"}
    # the finding on rank 1's GPU, on rank 1 only
    assert [(s.labels["rank"], s.labels["id"], s.value) for s in m["gputop_rank_finding"]] == [("1", "data-starved", 11.0)]
    # no environment value beyond the identity ones, and no secret anywhere
    for secret in (*SECRETS, "0123456789abcdef0123456789abcdef01234567", "/usr/bin"):
        assert secret not in text
    assert "HF_TOKEN" not in text and "PASSWORD" not in text


def test_a_rank_that_stands_still_is_stuck_with_where():
    _, m = scrape(four_ranks(stuck_rank=3), identify_on({r: "node-a" for r in range(4)}))
    stuck = {s.labels["rank"]: (s.value, s.labels["where"]) for s in m["gputop_rank_stuck"]}
    assert stuck["3"][0] == 1 and "train.py:66" in stuck["3"][1]
    assert stuck["1"][0] == 0
    secs = {s.labels["rank"]: s.value for s in m["gputop_rank_stuck_seconds"]}
    assert secs["3"] >= 5.0 and secs["1"] == 0


def test_a_secret_in_an_identity_value_never_reaches_a_label():
    ident = identity_of({"RANK": "0", "TORCHELASTIC_RUN_ID": SECRETS[0], "MASTER_ADDR": "n", "MASTER_PORT": "1"},
                        "node-a")
    assert ident is not None and SECRETS[0] not in ident.job and ident.job == "n:1"


@pytest.mark.parametrize("env, want", [
    ({"RANK": "3", "TORCHELASTIC_RUN_ID": "exp-42", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}, ("exp-42", "torchelastic")),
    ({"RANK": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, ("node-a/127.0.0.1:29500", "master")),
    ({"RANK": "3", "SLURM_JOB_ID": "777", "SLURM_STEP_ID": "0"}, ("777.0", "slurm")),
    ({"RANK": "3"}, ("node-a/pid99", "launcher")),
])
def test_the_job_id_from_the_first_launcher_that_names_it(env, want):
    ident = identity_of(env, "node-a", launcher_pid=99)
    assert (ident.job, ident.source) == want and ident.rank == 3


def test_not_a_rank_no_series():
    assert identity_of({"PATH": "/bin"}, "h", 1) is None
    _, m = scrape(four_ranks(seconds=3), lambda pid: None)
    assert "gputop_rank_info" not in m
