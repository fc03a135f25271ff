"""collectives-off-nvlink: NVLinks up and idle while the job's GPUs trade gigabytes a second both
ways over PCIe is the ranks' collectives going through host memory (P2P turned off, often from
Python where /proc cannot see it: the fifth held-out set's gpt2xl_p2p_off, 1.6x measured without)."""

from __future__ import annotations

from gputop.model import Category as C

from synth import Job, rule_findings

GPM = {"sm_active": 54.0, "sm_occupancy": 30.0, "tensor_active": 12.0, "fp32_active": 5.0}


def job(nvlink, pcie_tx, pcie_rx, gpus=2):
    return Job(seconds=40, gpus=gpus, util=lambda t: 99.0, main=lambda t: (C.FORWARD, C.BACKWARD)[int(t * 3) % 2],
               gpu={**GPM, "nvlink_tx_bps": nvlink / 2 if nvlink is not None else None,
                    "nvlink_rx_bps": nvlink / 2 if nvlink is not None else None,
                    "pcie_tx_bps": pcie_tx, "pcie_rx_bps": pcie_rx})


def test_idle_nvlink_with_pcie_both_ways_is_named_with_the_settings_that_cause_it():
    found, _ = rule_findings(job(0.0, 22e9, 20e9))
    f = found["collectives-off-nvlink"]
    assert f.title == "Collectives avoid NVLink: GPUs 0, 1 trade 22.0 GB/s+ each way over PCIe, NVLink idle"
    assert "NCCL_P2P_DISABLE" in f.action and "--ipc=host" in f.action
    assert any("GPU 1: NVLink 0.0 GB/s while PCIe carries 22.0 GB/s out and 20.0 GB/s in" in e for e in f.evidence)


def test_nvlink_carrying_the_collectives_is_silent():
    assert "collectives-off-nvlink" not in rule_findings(job(9.8e9, 0.1e9, 0.5e9))[0]


def test_pcie_one_way_is_data_or_checkpoints_not_collectives():
    assert "collectives-off-nvlink" not in rule_findings(job(0.0, 0.05e9, 20e9))[0]  # loading data
    assert "collectives-off-nvlink" not in rule_findings(job(0.0, 20e9, 0.05e9))[0]  # saving a checkpoint


def test_gpus_without_nvlink_read_or_one_gpu_say_nothing():
    assert "collectives-off-nvlink" not in rule_findings(job(None, 22e9, 20e9))[0]  # PCIe cards: no links up
    assert "collectives-off-nvlink" not in rule_findings(job(0.0, 22e9, 20e9, gpus=1))[0]


# --------------------------------------------------------------------------- real recordings (2 x H200)


def test_the_real_job_with_p2p_turned_off_from_python_is_told_to_let_nccl_use_nvlink():
    from test_nccl_real import replay_findings

    evals = replay_findings("gpt2xl_p2p_off-h200x2.gputop", every_s=1.0)
    shown_at = [t for t, _, shown in evals if any(f.id == "collectives-off-nvlink" for f in shown)]
    assert shown_at and shown_at[0] <= 10.0
    _, ctx, shown = evals[-1]
    f = next(f for f in shown if f.id == "collectives-off-nvlink")
    assert "GPUs 0, 1" in f.title and "NCCL_P2P_DISABLE" in f.action
    # the ranks' environment at start did not have it: the job set it from Python
    assert any("no NCCL_P2P_* setting" in e for e in f.evidence)


def test_the_real_healthy_job_whose_gradients_cross_nvlink_is_not_told():
    from test_nccl_real import replay_findings

    evals = replay_findings("trainer_t5-h200x2.gputop", every_s=1.0)
    assert all(f.id != "collectives-off-nvlink" for _, _, shown in evals for f in shown)
