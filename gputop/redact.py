"""Keep secrets out of the screen and out of recordings.

Command lines and environment values pass through here before they are stored; nothing
downstream sees the raw text.
"""

from __future__ import annotations

import re

REDACTED = "***"

# Names that mark a value as secret, as a whole word part (API_KEY, hf_token, DB_PASSWORD ...).
_SECRET_NAME = re.compile(
    r"(?i)(^|[_\-.])(key|keys|token|tokens|secret|secrets|password|passwd|pwd|pass|credential|credentials"
    r"|auth|apikey|api-key|private|cookie|session|signature|sig|bearer|dsn)($|[_\-.])"
    r"|(apikey|accesskey|secretkey|authtoken|password|passwd|credential)"
)

# Values that look like credentials whatever their name.
_SECRET_VALUE = re.compile(
    r"(?x)("
    r"hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_\-]{16,}"  # OpenAI-style
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r"|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]+"  # JWT
    r"|[A-Za-z0-9+/]{40,}={0,2}"  # long base64 blobs
    r")"
)

# user:password@ in URLs (s3://, postgres://, https://).
_URL_CREDS = re.compile(r"(?i)([a-z][a-z0-9+.\-]*://[^/\s:@]+):[^@\s/]+@")

# --flag=value / --flag value / KEY=value inside a command line.
_FLAG_EQ = re.compile(r"^(--?[A-Za-z0-9_\-.]+|[A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_value(name: str, value: str) -> str:
    """An environment value as it may be shown: hidden when its name or its shape is secret."""
    if is_secret_name(name):
        return REDACTED
    return redact_text(value)


def redact_text(text: str) -> str:
    text = _URL_CREDS.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)
    return _SECRET_VALUE.sub(REDACTED, text)


def redact_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """Redact a command line: values of secret-named flags and secret-looking tokens."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        m = _FLAG_EQ.match(arg)
        if m:
            name, value = m.groups()
            if is_secret_name(name.lstrip("-")):
                out.append(f"{name}={REDACTED}")
            else:
                out.append(f"{name}={redact_text(value)}")
            continue
        if arg.startswith("-") and is_secret_name(arg.lstrip("-")):
            out.append(arg)
            hide_next = True
            continue
        out.append(redact_text(arg))
    return out


def redact_cmdline(argv: list[str] | tuple[str, ...]) -> str:
    return " ".join(redact_argv(argv))


# Environment keys that matter for performance: shown (redacted) in the process detail and used
# by the advisor (CUDA_LAUNCH_BLOCKING, OMP_NUM_THREADS, NCCL_*, PYTORCH_CUDA_ALLOC_CONF, ...).
PERF_ENV_PREFIXES = ("CUDA_", "NCCL_", "OMP_", "MKL_", "PYTORCH_", "TORCH_", "NVIDIA_", "OPENBLAS_", "TF_")


def perf_env(environ: dict[str, str]) -> tuple[tuple[str, str], ...]:
    items = [
        (k, redact_value(k, v)) for k, v in environ.items() if k.startswith(PERF_ENV_PREFIXES)
    ]
    return tuple(sorted(items))
