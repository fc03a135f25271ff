from gputop.redact import REDACTED, perf_env, redact_argv, redact_cmdline, redact_text, redact_value


def test_secret_flags_and_assignments_are_hidden():
    argv = ["python", "train.py", "--api-key", "abc123", "--token=xyz", "--lr=0.1", "WANDB_API_KEY=foo", "--password", "pw"]
    out = redact_argv(argv)
    assert out == ["python", "train.py", "--api-key", REDACTED, f"--token={REDACTED}", "--lr=0.1", f"WANDB_API_KEY={REDACTED}", "--password", REDACTED]
    joined = redact_cmdline(argv)
    for secret in ("abc123", "xyz", "foo", " pw"):
        assert secret not in joined


def test_secret_looking_values_are_hidden_whatever_their_name():
    assert redact_text("hf_" + "a" * 30) == REDACTED
    assert redact_text("ghp_" + "B" * 36) == REDACTED
    assert "AKIAABCDEFGHIJKLMNOP" not in redact_text("id=AKIAABCDEFGHIJKLMNOP")
    assert redact_text("s3://alice:hunter2@bucket/data") == f"s3://alice:{REDACTED}@bucket/data"
    assert redact_text("--epochs 10") == "--epochs 10"


def test_env_values():
    assert redact_value("HF_TOKEN", "abc") == REDACTED
    assert redact_value("NCCL_SOCKET_IFNAME", "eth0") == "eth0"
    env = perf_env({"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/bin", "TORCH_HUB_TOKEN": "t", "OMP_NUM_THREADS": "4", "AWS_SECRET_ACCESS_KEY": "k"})
    assert env == (("CUDA_VISIBLE_DEVICES", "0,1"), ("OMP_NUM_THREADS", "4"), ("TORCH_HUB_TOKEN", REDACTED))
