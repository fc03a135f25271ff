"""gputop.redact: what is hidden, what is kept (false positives), the forms a command line reaches
it in (argv; joined and split at whitespace, as py-spy's header and a recording's second pass
give it), and its cost. The end-to-end paths (recording, ``stacks --json``) are in
test_redact_e2e.py."""

from __future__ import annotations


import pytest

from gputop.redact import (
    REDACTED,
    is_secret_name,
    perf_env,
    redact_argv,
    redact_cmdline,
    redact_text,
    redact_value,
)


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


# --------------------------------------------------------------------------- hidden

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpM"

# (argv, the secrets that must not survive). Each secret is unique so a leak names its case.
SECRET_CASES = [
    # JSON in an argument: one argv element, also split at whitespace below
    (["python", "t.py", "--env", '{"HF_TOKEN": "hf_JSONSECRET5", "api_key": "JSONSECRET6", "password":"JSONSECRET7"}'],
     ["JSONSECRET5", "JSONSECRET6", "JSONSECRET7"]),
    (["python", "t.py", '{"wandb": {"api_key": "NESTEDSECRET"}, "lr": 0.1}'], ["NESTEDSECRET"]),
    (["python", "t.py", "--cfg", '{"password": 12345678, "db": "x"}'], ["12345678"]),
    (["python", "t.py", "--cfg", '{"password": "two WORDSECRET words"}'], ["two", "WORDSECRET"]),
    (["python", "t.py", "--kwargs", "{'token': 'PYDICTSECRET'}"], ["PYDICTSECRET"]),
    (["python", "t.py", "api_key: YAMLSECRET"], ["YAMLSECRET"]),
    (["python", "t.py", "--override", "client_secret: YAMLSECRET2"], ["YAMLSECRET2"]),
    # HTTP headers
    (["curl", "-H", "Authorization: Bearer BEARERSECRET4", "https://api.example.com"], ["BEARERSECRET4"]),
    (["curl", "-H", "Bearer BEARERSECRET5"], ["BEARERSECRET5"]),
    (["curl", "--header", "Bearer BEARERSECRET6"], ["BEARERSECRET6"]),
    (["curl", "-H", "Authorization: Basic QkFTSUNTRUNSRVQ="], ["QkFTSUNTRUNSRVQ"]),
    (["curl", "-H", "Authorization: BARESECRET"], ["BARESECRET"]),
    (["curl", "-H", "X-Api-Key: APIKEYSECRET"], ["APIKEYSECRET"]),
    (["curl", "-H", "Private-Token: GITLABHDRSECRET"], ["GITLABHDRSECRET"]),
    (["curl", "-H", "Cookie: session=COOKIESECRET1; csrftoken=COOKIESECRET2"], ["COOKIESECRET1", "COOKIESECRET2"]),
    (["curl", "-u", "bob:CURLSECRET", "https://x"], ["CURLSECRET"]),
    # Hydra / OmegaConf overrides
    (["python", "train.py", "logger.wandb.api_key=HYDRASECRET1"], ["HYDRASECRET1"]),
    (["python", "train.py", "++hf_token=HYDRASECRET2"], ["HYDRASECRET2"]),
    (["python", "train.py", "+logger.api_key=HYDRASECRET3"], ["HYDRASECRET3"]),
    (["python", "train.py", "trainer.token=HYDRASECRET4"], ["HYDRASECRET4"]),
    (["python", "train.py", "db/password=HYDRASECRET5"], ["HYDRASECRET5"]),
    (["python", "train.py", "--config.wandb.api_key=DOTTEDSECRET"], ["DOTTEDSECRET"]),
    # URLs: user:password, and an empty user
    (["python", "t.py", "--redis", "redis://:REDISSECRET3@host:6379"], ["REDISSECRET3"]),
    (["python", "t.py", "https://:URLSECRET1@host/x"], ["URLSECRET1"]),
    (["python", "t.py", "postgres://me:URLSECRET2@db:5432/x"], ["URLSECRET2"]),
    (["python", "t.py", "--url", "https://h/o?X-Amz-Signature=SIGSECRET&X-Amz-Security-Token=STSSECRET&x=1"],
     ["SIGSECRET", "STSSECRET"]),
    (["python", "t.py", "https://acct.blob.core.windows.net/c?sv=2022&sig=SASSECRET"], ["SASSECRET"]),
    # secret-named flags and assignments
    (["python", "t.py", "--token=TOKSECRET"], ["TOKSECRET"]),
    (["python", "t.py", "--password", "PWSECRET"], ["PWSECRET"]),
    (["python", "t.py", "--hf_token", "HFFLAGSECRET"], ["HFFLAGSECRET"]),
    (["env", "TOKEN=ENVASSIGNSECRET", "python", "t.py"], ["ENVASSIGNSECRET"]),
    (["python", "t.py", "--env=HF_TOKEN=NESTEDASSIGN"], ["NESTEDASSIGN"]),
    (["python", "t.py", "--env", "A=1,WANDB_API_KEY=LISTSECRET,B=2"], ["LISTSECRET"]),
    (["python", "t.py", "--secret", "S1SECRET"], ["S1SECRET"]),
    (["python", "t.py", "--private-key", "S2SECRET"], ["S2SECRET"]),
    (["python", "t.py", "--client_secret=S3SECRET"], ["S3SECRET"]),
    (["python", "t.py", "--access_token", "S4SECRET"], ["S4SECRET"]),
    (["python", "t.py", "--refresh_token=S5SECRET"], ["S5SECRET"]),
    (["python", "t.py", "--auth", "S6SECRET"], ["S6SECRET"]),
    (["python", "t.py", "--credentials", "S7SECRET"], ["S7SECRET"]),
    (["python", "t.py", "--passwd=S8SECRET"], ["S8SECRET"]),
    (["python", "t.py", "pwd=S9SECRET"], ["S9SECRET"]),
    (["python", "t.py", "aws_secret_access_key=S10SECRET"], ["S10SECRET"]),
    (["python", "t.py", "--apiKey", "CAMELSECRET"], ["CAMELSECRET"]),
    (["python", "t.py", "--use_auth_token", "USEAUTHSECRET"], ["USEAUTHSECRET"]),
    (["python", "t.py", "DBPASSWORD=GLUEDSECRET"], ["GLUEDSECRET"]),
    (["python", "t.py", "--password", "-5"], ["-5"]),  # a value, not a flag
    (["redis-server", "--requirepass", "REDISPASS"], ["REDISPASS"]),
    # programs whose short options carry a password
    (["mysql", "-u", "root", "-pMYSQLSECRET", "db"], ["MYSQLSECRET"]),
    (["/usr/bin/mysqldump", "-pDUMPSECRET"], ["DUMPSECRET"]),
    (["sshpass", "-p", "SSHPASSSECRET", "ssh", "host"], ["SSHPASSSECRET"]),
    (["redis-cli", "-a", "REDISCLISECRET", "ping"], ["REDISCLISECRET"]),
    # shapes, whatever the name
    (["python", "t.py", "sk-proj-" + "aB3" * 8], ["aB3aB3aB3"]),
    (["python", "t.py", "ghp_" + "C" * 36], ["CCCCCCCCCC"]),
    (["python", "t.py", "github_pat_" + "D1" * 20], ["D1D1D1D1"]),
    (["python", "t.py", "glpat-" + "E2" * 10], ["E2E2E2E2"]),
    (["python", "t.py", "--x", "xoxb-123456789012-abcdefABCDEF"], ["abcdefABCDEF"]),
    (["python", "t.py", "AKIAABCDEFGHIJKLMNOP"], ["AKIAABCDEFGHIJKLMNOP"]),
    (["python", "t.py", "ASIAABCDEFGHIJKLMNOP"], ["ASIAABCDEFGHIJKLMNOP"]),
    (["python", "t.py", "AIza" + "F3" * 17 + "x"], ["F3F3F3F3"]),
    (["python", "t.py", "sk_live_" + "G4" * 12], ["G4G4G4G4"]),
    (["python", "t.py", "--jwt", JWT], ["SflKxwRJSMeKKF2QT4fwpM", "eyJzdWIiOiIxMjM0NTY3ODkwIn0"]),
    (["wandb", "login", "0123456789abcdef0123456789abcdef01234567"], ["0123456789abcdef0123456789abcdef01234567"]),
    (["python", "t.py", "hf_" + "H5" * 15], ["H5H5H5H5"]),
    # a command line that is one argument: the live process table showed it in clear
    (["sh", "-c", "python train.py --hf-token SHSECRET1 --lr 3"], ["SHSECRET1"]),
    (["bash", "-c", "huggingface-cli login --token 'SHSECRET2'"], ["SHSECRET2"]),
]


def _forms(argv):
    """Every form a command line reaches the redactor in, as text."""
    joined = redact_cmdline(argv)
    return {
        "cmdline": joined,
        "argv": " ".join(redact_argv(argv)),
        "split": redact_cmdline(" ".join(argv).split()),  # py-spy's header
        "split_argv": " ".join(redact_argv(" ".join(argv).split())),
        "second_pass": redact_cmdline(joined.split(" ")),  # the recording's codec pass
    }


@pytest.mark.parametrize("argv,secrets", SECRET_CASES, ids=[" ".join(a)[:60] for a, _ in SECRET_CASES])
def test_secret_is_hidden_in_every_form(argv, secrets):
    for form, text in _forms(argv).items():
        assert REDACTED in text, (form, text)
        for secret in secrets:
            assert secret not in text, (form, secret, text)


@pytest.mark.parametrize("argv,secrets", SECRET_CASES, ids=[" ".join(a)[:60] for a, _ in SECRET_CASES])
def test_redaction_is_idempotent(argv, secrets):
    once = redact_cmdline(argv)
    assert redact_cmdline(once.split(" ")) == once
    assert redact_text(once) == once


def test_what_stays_around_a_hidden_value():
    """The structure is kept, only the value goes: the reader still sees which flag, key or header."""
    cases = {
        ("--env", '{"HF_TOKEN": "hf_JSONSECRET5", "api_key": "J6", "password":"J7", "lr": 0.1}'):
            '--env {"HF_TOKEN": "***", "api_key": "***", "password":"***", "lr": 0.1}',
        ("-H", "Authorization: Bearer B4"): "-H Authorization: Bearer ***",
        ("-H", "Authorization: Basic dXNlcjpwYXNz"): "-H Authorization: Basic ***",
        ("-H", "Bearer B4"): "-H Bearer ***",
        ("-H", "X-Api-Key: K"): "-H X-Api-Key: ***",
        ("-H", "Cookie: a=1; b=2", "-X", "GET"): "-H Cookie: *** -X GET",
        ("logger.wandb.api_key=H1", "++hf_token=H2", "+logger.api_key=H3", "trainer.token=H4", "trainer.lr=3"):
            "logger.wandb.api_key=*** ++hf_token=*** +logger.api_key=*** trainer.token=*** trainer.lr=3",
        ("redis://:R3@host:6379", "https://u:p@h/x"): "redis://:***@host:6379 https://u:***@h/x",
        ("--url", "https://h/o?a=1&X-Amz-Signature=S&b=2"): "--url https://h/o?a=1&X-Amz-Signature=***&b=2",
        ("api_key: Y",): "api_key: ***",
    }
    for args, want in cases.items():
        assert redact_cmdline(["python", *args]) == "python " + want
    assert redact_cmdline(["mysql", "-uroot", "-pS", "-p", "db"]) == "mysql -uroot -p*** -p db"
    assert redact_cmdline(["curl", "-u", "bob:S", "-u", "alice"]) == "curl -u bob:*** -u alice"


# --------------------------------------------------------------------------- kept

# Ordinary arguments that must come out exactly as they went in.
KEEP_CASES = [
    ["python", "t.py", "--max_tokens=512", "--max_new_tokens", "128", "--num_tokens", "10"],
    ["python", "t.py", "--tokenizer=gpt2", "--tokenizer_name", "meta-llama/Llama-2-7b-hf"],
    ["python", "t.py", "--password-file", "/etc/app/pw.txt", "--token_path", "/home/u/.hf/token"],
    ["python", "t.py", "--secret-name", "my-k8s-secret", "--key-file", "/etc/ssl/k.pem"],
    ["python", "t.py", "--auth-type", "basic", "--auth_method", "oauth"],
    ["python", "t.py", "--private", "--push_to_hub", "--hub_model_id", "me/model"],
    ["python", "t.py", "--pad_token", "<pad>", "--eos_token_id=2", "--bos_token_id", "1", "--token_type_ids", "0"],
    ["python", "t.py", "--sort_key", "loss", "--text_key=text", "--image_key", "jpg", "--rng_key", "0"],
    ["python", "t.py", "--num_passes", "2", "--second_pass", "--no_auth", "--session", "run1"],
    ["python", "t.py", "--use_auth_token", "--model", "gpt2"],  # a switch: the next flag is not its value
    ["python", "t.py", "--run_name=task-finetune-llama2-7b-chat", "--tag", "mask-rcnn-resnet50-fpn-coco-2x"],
    ["python", "t.py", "--data", "/mnt/Data2/ImageNet/train/n01440764/n0144076", "--out", "/scratch/ckpt"],
    ["python", "t.py", "--lr", "-3", "-p", "8080", "-p", "config.yaml", "-pX"],  # -p means nothing to python
    ["torchrun", "--nproc_per_node=8", "--master_port=29500", "--rdzv_endpoint=10.0.0.1:29400", "train.py"],
    ["python", "t.py", "trainer.max_epochs=100", "model.optimizer.lr=1e-3", "+experiment=baseline", "~callbacks.early"],
    ["python", "t.py", "--data", "s3://bucket/prefix/train", "https://huggingface.co/gpt2/resolve/main/x.bin"],
    ["python", "t.py", "PWD=/home/me/work", "--cwd", "/home/me"],
    ["python", "t.py", "--monitor", "val/loss:min", "--cfg", '{"lr": 0.1, "max_tokens": 512, "pad_token": "<pad>"}'],
    ["nvidia-smi", "dmon", "-s", "pucvmet"],
    ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"],
]


@pytest.mark.parametrize("argv", KEEP_CASES, ids=[" ".join(a)[:60] for a in KEEP_CASES])
def test_ordinary_arguments_are_kept(argv):
    assert redact_cmdline(argv) == " ".join(argv)
    assert redact_argv(argv) == list(argv)
    assert redact_cmdline(" ".join(argv).split()) == " ".join(" ".join(argv).split())


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "hf_token", "token", "api_key", "apiKey", "APIKEY", "x-api-key", "WANDB_API_KEY",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "client_secret", "access_token", "refresh_token",
    "auth", "http_auth", "credentials", "passwd", "pwd", "password", "DB_PASS", "private_key",
    "private-key", "Authorization", "Cookie", "sig", "X-Amz-Signature", "logger.wandb.api_key",
    "use_auth_token", "key", "SENTRY_DSN", "github_token_2", "PGPASSWORD",
])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "max_tokens", "num_tokens", "tokenizer", "tokenizer_name", "pad_token", "eos_token_id",
    "token_type_ids", "password_file", "password-file", "token_path", "HF_TOKEN_PATH", "secret_name",
    "key_file", "auth_type", "auth-type", "private", "session", "sort_key", "rng_key", "keys",
    "num_passes", "second_pass", "no_auth", "PWD", "OLDPWD", "AWS_ACCESS_KEY_ID", "NCCL_IB_PKEY",
    "master_port", "passes", "signal", "keyword", "monkey",
])
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_messages_keep_their_text():
    """redact_text also runs over events and findings: ordinary prose and numbers stay."""
    for text in (
        "Set NCCL_DEBUG=INFO and rerun", "throughput 1234 tokens/s: 12 % below", "max_tokens: 512",
        "data loader: 4 workers, pin_memory=False", "target started: python train.py --lr 0.1",
        "GPU 0 at 91 % (sm_active=0.91)", "checkpoint pass 2 of 3", "see https://pytorch.org/docs",
    ):
        assert redact_text(text) == text


def test_env_values_by_name_and_shape():
    assert redact_value("HF_TOKEN", "x") == REDACTED
    assert redact_value("MY_SERVICE_PASSWORD", "x") == REDACTED
    assert redact_value("NCCL_IB_HCA", "mlx5_0") == "mlx5_0"
    assert redact_value("TORCH_HOME", "/data/torch") == "/data/torch"
    assert redact_value("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True") == "expandable_segments:True"
    assert redact_value("SOME_URL", "redis://:S@h:1") == f"redis://:{REDACTED}@h:1"
    assert redact_value("TF_X", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc") == REDACTED


# --------------------------------------------------------------------------- cost

TYPICAL = [
    "python train.py --lr 3e-4 --batch_size 32 --epochs 10 --data /mnt/data/imagenet --output_dir ./out",
    "torchrun --nproc_per_node=8 --master_port=29500 train.py --config configs/llama7b.yaml --max_tokens=4096",
    "/usr/bin/python3 -m torch.distributed.run --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 finetune.py"
    " --model_name_or_path meta-llama/Llama-2-7b-hf --tokenizer_name gpt2",
    "python -m vllm.entrypoints.openai.api_server --model mistralai/Mistral-7B-v0.1 --port 8000"
    " --tensor-parallel-size 2 --max-model-len 8192",
    "accelerate launch --config_file ds.yaml run_clm.py --dataset_name wikitext --per_device_train_batch_size 8"
    " --gradient_accumulation_steps 4 --bf16 --report_to wandb",
    "deepspeed --num_gpus 8 train.py --deepspeed ds_config.json --pad_token_id 0 --eos_token_id 2",
    "python train.py trainer.max_epochs=100 model.optimizer.lr=1e-3 data.batch_size=64 logger=wandb +experiment=baseline",
    "/opt/conda/bin/python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"
    " --multiprocessing-fork",
    "python /home/user/.local/lib/python3.10/site-packages/ipykernel_launcher.py -f"
    " /home/user/.local/share/jupyter/runtime/kernel-1234.json",
    "ray::TrainTrainable.train() ray_worker --node-ip-address=10.1.2.3 --object-store-name=/tmp/ray/session_2024/sockets/plasma",
    "bash -c cd /work && python eval.py --checkpoint ckpt/step_1000.pt --num_samples 500",
    "nvidia-smi dmon -s pucvmet",
    "python train.py --hf_token hf_AbCdEfGhIjKlMnOpQrStUvWxYz123456 --wandb_api_key 0123456789abcdef0123456789abcdef01234567",
    "python serve.py --auth-type basic --password-file /etc/pw --max_tokens=512 --num_tokens 10",
    "pt_main_thread",
    "python3 -u main.py",
    'python train.py --env {"HF_TOKEN": "hf_x", "lr": 0.1}',
    "curl -H Authorization: Bearer abc https://api.example.com/v1/models",
    "python -m sglang.launch_server --model-path Qwen/Qwen2-7B --port 30000 --mem-fraction-static 0.8",
    "python train.py --data s3://bucket/prefix/train --cache_dir /scratch/cache --seed 42 --run_name task-ft-llama2",
]
