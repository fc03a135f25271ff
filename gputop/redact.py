"""Keep secrets out of the screen and out of recordings.

Command lines, environment values and the source lines of stack frames pass through here before
they are stored; nothing downstream sees the raw text.

Two things make a value secret: its *name* (``--api-key X``, ``HF_TOKEN=X``, ``"password": X``,
``Authorization: Bearer X``) or its *shape* (``hf_…``, ``ghp_…``, ``AKIA…``, a JWT). Names are
judged part by part (``logger.wandb.api_key`` -> logger, wandb, api, key), so that a secret word
counts as a word, not as letters inside another (``tokenizer``, ``max_tokens``, ``--private`` and
``--auth-type`` are not secrets; ``--password-file PATH`` names a file, not the password).

Where a rule could hide an ordinary argument or leave a secret, it leans to hiding the secret,
except where the common ML spelling says otherwise (``pad_token``, ``sort_key``, ``num_passes``);
each choice is written next to its rule.

Cost: called for every process on every poll (the host source keeps a line 10 s). On ~100
typical command lines (~100 characters) it averages ~8 µs each on the 2-core dev box (the
previous, narrower version: ~13 µs); tests/test_redact.py holds it under 20 µs. Cost grows with length:
~70 µs for a 1,000-character line. The fast paths: names are judged once (lru_cache), and the
text scans look for the few secret words in the lower-cased line before any name is parsed.
A source line (``redact_code``) costs ~3 µs the first time (40 characters on average) and a cache
lookup after: the stack sampler meets the same few lines in every sample.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Sequence

REDACTED = "***"

# --------------------------------------------------------------------------- names

# A name's parts: split at anything not a letter or digit, and at camelCase humps (apiKey).
_PARTS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")

# Parts that make a name secret wherever they stand in it (but see _ABOUT).
_SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "passphrase", "passcode",  # passwords (pwd=: see _NOT_SECRET)
    "secret", "secrets", "credential", "credentials", "creds",  # client_secret, credentials
    "apikey", "privatekey", "accesskey", "secretkey",  # glued spellings (APIKEY, privateKey -> camel)
    "authtoken", "accesstoken", "refreshtoken", "apitoken", "clientsecret",
    "authorization", "bearer", "cookie", "cookies",  # HTTP headers
    "dsn",  # Sentry / database DSNs carry the key
    "signature",  # X-Amz-Signature=, signed URLs
    "requirepass", "masterauth",  # redis-server options
})

# Parts containing these are secret too: names glued without separators (DBPASSWORD, myApiKeyV2).
_SECRET_INFIXES = ("password", "passwd", "apikey", "secretkey", "accesskey", "authtoken", "credential")

# Words that are secret only as the name's last part (``hf_token`` yes, ``token_id`` no), and not
# after the ML qualifiers listed: ``pad_token``/``eos_token`` are vocabulary entries,
# ``sort_key``/``rng_key`` dict or PRNG keys, ``num_pass`` a count, ``no_auth`` a switch.
_LAST_WORDS: dict[str, frozenset[str]] = {
    "token": frozenset({
        "pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end", "stop", "special", "max",
        "min", "num", "image", "video", "audio", "vision", "text", "new", "added", "extra", "prefix",
        "suffix", "middle", "placeholder", "think", "first", "last", "next", "per", "decoder",
        "encoder", "default", "boi", "eoi", "sot", "eot", "fim",
    }),
    "key": frozenset({
        "sort", "text", "image", "label", "labels", "input", "output", "metric", "monitor", "target",
        "column", "field", "dict", "primary", "foreign", "cache", "group", "partition", "join", "hash",
        "dataset", "data", "caption", "prompt", "response", "answer", "question", "lookup", "map",
        "sample", "feature", "batch", "mask", "result", "value", "instance", "seed", "rng", "prng",
        "random", "state", "model", "config", "index", "shard", "bucket", "object", "s3", "chosen",
        "rejected", "messages", "conversation", "hot", "best", "split", "id", "name",
        "weight", "loss", "score", "reward", "sorting", "query",
    }),
    "pass": frozenset({
        "num", "second", "first", "multi", "single", "forward", "backward", "fast", "full", "dry",
        "one", "two", "each", "min", "max", "by",
    }),
    "auth": frozenset({"use", "no", "enable", "disable", "with", "without", "require", "skip"}),
    "sig": frozenset(),  # Azure SAS ``&sig=``
    # ``DB_PW``, ``smtp_pw``; not a pointwise layer (``conv_pw``, ``pw_conv`` has it first).
    "pw": frozenset({"conv", "dw", "linear", "proj", "layer", "block", "bn", "norm", "act", "mlp", "fc", "se",
                     "expand", "project", "depthwise", "pointwise", "max", "min", "avg", "mean"}),
}

# A part after the secret word that says the value is *about* the secret: a file holding it, its
# length, its type... (``--password-file PATH``, ``--auth-type basic``, ``--secret-name NAME``,
# ``HF_TOKEN_PATH``). A path is not the secret; whoever can read the file could anyway.
_ABOUT = frozenset({
    "file", "files", "path", "paths", "dir", "filename", "filepath", "location", "jar", "type",
    "types", "method", "mode", "name", "names", "len", "length", "size", "count", "limit",
    "budget", "env", "var", "header", "field", "column", "url", "uri", "endpoint", "host", "port",
    "scheme", "provider", "strategy", "backend", "version", "timeout", "ttl", "format", "enabled",
    "enable", "required", "policy", "rotation", "expiry", "id", "ids", "idx", "index",
})

# Names that look secret but are not: the shell's working directories (``PWD=/home/x``).
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})


@lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a value called ``name`` (a flag, a variable, a JSON key, a header) is a secret."""
    if name in _NOT_SECRET:
        return False
    parts = [p.lower() for p in _PARTS.split(name) if p and not p.isdigit()]
    if not parts:
        return False
    last = parts[-1]
    if last in _LAST_WORDS and (len(parts) == 1 or parts[-2] not in _LAST_WORDS[last]):
        return True
    for i in range(len(parts) - 1, -1, -1):
        p = parts[i]
        if p in _SECRET_WORDS or any(x in p for x in _SECRET_INFIXES):
            return not any(q in _ABOUT for q in parts[i + 1:])
    return False


# --------------------------------------------------------------------------- free text

# Values that look like credentials whatever their name: one entry per issuer, each anchored so
# that it does not start inside a word (``task-finetune-…`` holds "sk-" but is a run name).
_SHAPES = (
    r"hf_[A-Za-z0-9]{20,}",  # Hugging Face access token
    r"sk-(?=[A-Za-z_\-]*[0-9])[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic (sk-ant-); has a digit
    r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe secret / restricted key
    r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub token (classic, OAuth, app)
    r"github_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained token
    r"glpat-[A-Za-z0-9_\-]{20,}",  # GitLab personal access token
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack bot/user/app tokens
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",  # AWS access key id (long-term / temporary)
    r"AIza[0-9A-Za-z_\-]{35}",  # Google API key
    r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]+",  # JWT (header.payload.sig)
)
# A long base64/hex blob standing alone (W&B keys are 40 hex, many others base64). Judged in
# _blob: it needs a digit and a letter, and a path (two slashes and a lowercase word between) is
# kept. Known over-redaction: a bare 40-hex git SHA is hidden too (it looks like a W&B key).
_BLOB = r"(?<![A-Za-z0-9+/_.\-])(?P<blob>[A-Za-z0-9+/]{40,}={0,2})(?![A-Za-z0-9+/_.\-])"
_SHAPES_RE = re.compile(r"(?<![A-Za-z0-9_])(?:" + "|".join(_SHAPES) + ")")
_BLOB_RE = re.compile(_BLOB)
_PATH_WORD = re.compile(r"/[a-z]{3,}(?:/|$)")


def _blob(m: re.Match) -> str:
    s = m.group("blob")
    if not (any(c.isdigit() for c in s) and any(c.isalpha() for c in s)):
        return s
    if s.count("/") >= 2 and _PATH_WORD.search(s):
        return s
    return REDACTED


# user:password@ in URLs (s3://, postgres://, https://), the user possibly empty (redis://:pw@).
_URL_CREDS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]*):[^@\s/]+@")

# Cookie header: its value is a ;-list (``Cookie: a=1; b=2``), all of it hidden.
_COOKIE = re.compile(r"(?i)(?<![\w\-])((?:set-)?cookie[\"']?\s*:\s*)[^\s;\"']+(?:;\s*[^\s;\"']+)*")

# ``Bearer X`` on its own (``-H "Bearer X"``); after ``Authorization:`` the name rule keeps it too.
_BEARER = re.compile(r"(?i)(?<![\w\-])(bearer\s+)[A-Za-z0-9._~+/\-]+=*")

# name=value and name: value inside text: JSON ("api_key": "X"), YAML (api_key: X), Hydra
# overrides (logger.wandb.api_key=X, ++hf_token=X), query strings (&sig=X), headers
# (X-Api-Key: X; Authorization: Basic X keeps the scheme). The name decides (is_secret_name).
# Found from a secret word followed by the separator (a fast scan of the lower-cased text: most
# names in a command line hold none), then the name is read back to its start.
_KV_WORDS = r"(?:pass|pwd|pw|secret|token|key|auth|cred|cookie|bearer|dsn|sig)"
_KV_CAND = re.compile(_KV_WORDS + r"[a-z0-9_.\-]*(?P<q>[\"']?)\s*[:=]\s*")
_KV_CAND_I = re.compile(r"(?i)" + _KV_WORDS + r"[a-z0-9_.\-]*(?P<q>[\"']?)\s*[:=]\s*")  # non-ASCII text
_KV_VAL = re.compile(
    r"(?P<scheme>(?i:bearer|basic|digest|token|negotiate)\s+)?"
    r"(?P<val>\"[^\"]*\"|'[^']*'|[^\s,;&{}\[\]()\"']+)"
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


# A file name (an extension closes it) followed by ":" and a line number is a place in the code.
_FILE_NAME = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,5}$")
_LINE_NO = re.compile(r"\d+(?![\w.])")


def _redact_kv(text: str, low: str | None) -> str:
    """Only a secret name's value is consumed: after a plain one (``--env=``, ``max_tokens=``)
    the scan goes on inside its value (``--env=HF_TOKEN=x``)."""
    values: list[re.Match] = []
    pos = 0
    cands = _KV_CAND.finditer(low) if low is not None else _KV_CAND_I.finditer(text)
    for m in cands:
        start = m.start()
        if start < pos:
            continue  # inside a value already hidden
        while start > pos and text[start - 1] in _NAME_CHARS:
            start -= 1
        name_end = m.start("q")
        if not is_secret_name(text[start:name_end].lstrip("-.")):
            continue
        if ":" in text[name_end:m.end()] and _FILE_NAME.search(text, start, name_end) and _LINE_NO.match(text, m.end()):
            continue  # "leak_secret.py:13": a file's line, not a secret's value
        v = _KV_VAL.match(text, m.end())
        if v is None:
            continue
        values.append(v)
        pos = v.end()
    return _hide_values(text, values)


def _hide_values(text: str, values: Sequence[re.Match]) -> str:
    """``text`` with the ``val`` group of each of ``values`` (matches of _KV_VAL, in order, apart)
    hidden, its quotes kept."""
    if not values:
        return text
    out: list[str] = []
    pos = 0
    for v in values:
        val = v.group("val")
        out.append(text[pos:v.start("val")])
        out.append(val[0] + REDACTED + val[0] if val[0] in "\"'" else REDACTED)
        pos = v.end()
    out.append(text[pos:])
    return "".join(out)


# A secret-named option and its value apart, inside one text: a command line that is one
# argument (``sh -c "train.py --hf-token X; echo done"``) or a string literal in code
# (``"huggingface-cli login --token X"``), which the argument-wise pass never sees split. The option
# starts a word; a value that is the next option (``--use_auth_token --model``) is none.
_FLAG_SP = r"(?<![^\s\"'])(?P<name>--?[a-z0-9_.\-]*" + _KV_WORDS + r"[a-z0-9_.\-]*)\s+(?=[^\s\-]|-[\d.])"
_FLAG_SP_CAND = re.compile(_FLAG_SP)
_FLAG_SP_CAND_I = re.compile(r"(?i)" + _FLAG_SP)


def _redact_flag_values(text: str, low: str | None) -> str:
    values: list[re.Match] = []
    pos = 0
    for m in _FLAG_SP_CAND.finditer(low) if low is not None else _FLAG_SP_CAND_I.finditer(text):
        if m.start() < pos or not is_secret_name(m.group("name").lstrip("-")):
            continue
        v = _KV_VAL.match(text, m.end())
        if v is None:
            continue
        values.append(v)
        pos = v.end()
    return _hide_values(text, values)


def redact_text(text: str) -> str:
    """Free text (a joined command line, a message): secrets by name and by shape."""
    if "://" in text:
        text = _URL_CREDS.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)
    low = text.lower() if text.isascii() else None  # same indices as text, for the fast scans
    n = 0
    if low is None or "cookie" in low:
        text, k = _COOKIE.subn(lambda m: m.group(1) + REDACTED, text)
        n += k
    if low is None or "bearer" in low:
        text, k = _BEARER.subn(lambda m: m.group(1) + REDACTED, text)
        n += k
    if n and low is not None:
        low = text.lower()
    if "-" in text:
        flagged = _redact_flag_values(text, low)
        if flagged is not text:
            text, low = flagged, flagged.lower() if low is not None else None
    text = _redact_kv(text, low)
    text = _SHAPES_RE.sub(REDACTED, text)
    return _BLOB_RE.sub(_blob, text) if len(text) >= 40 else text


def redact_value(name: str, value: str) -> str:
    """An environment value as it may be shown: hidden when its name or its shape is secret."""
    if is_secret_name(name):
        return REDACTED
    return redact_text(value)


# --------------------------------------------------------------------------- source lines

# A stack frame's source line is code, not a command line: a secret name's value is hidden where
# it is assigned a literal (``api_key="…"``, ``"password": "…"``, ``cfg["token"] = "…"``,
# ``secret: str = "…"``, ``auth=("bob", "…")``), not where it is an expression
# (``token=os.environ["HF_TOKEN"]``, ``key = jax.random.PRNGKey(0)``): an expression says where the
# secret is, not what it is. Comparisons are kept (``if key == "labels"``, common in collators):
# a secret compared in code is left to the shapes. Inside a string literal or a comment the text
# is free text (``"host=db password=x"``, ``# token: x``) and read as command lines are. Shapes
# (tokens, long blobs), passwords in URLs, Bearer values and cookies are hidden wherever they stand.

# A string literal; one the line leaves open (a cut line, a string continued on the next) runs
# to the end of the line.
_LIT = (r"[rRbBuUfF]{0,2}(?:" r'"""(?:\\.|[^\\])*?(?:"""|$)' r"|'''(?:\\.|[^\\])*?(?:'''|$)"
        r'|"(?:\\.|[^"\\])*(?:"|$)' r"|'(?:\\.|[^'\\])*(?:'|$))")
_LIT_RE = re.compile(_LIT)
_LIT_HEAD = re.compile(r"([rRbBuUfF]{0,2})(\"\"\"|'''|\"|')")
_CODE_VAL = re.compile(
    rf"(?P<lit>{_LIT})"
    r"|(?P<num>\d[\w.]*)"
    rf"|(?P<group>[(\[]\s*{_LIT}(?:\s*,\s*{_LIT})*\s*,?\s*[)\]])"
)
# A secret word, the rest of its name, the quote and bracket that close a string key
# (``cfg["token"]``), a type annotation (``api_key: str =``), then the assignment or dict colon
# (not ``==``).
_CODE_CAND = re.compile(
    _KV_WORDS + r"[a-z0-9_.\-]*(?P<q>[\"']?)(?:\s*\])?\s*"
    r"(?::\s*[a-z_][\w.\[\], |]*?\s*(?==(?!=)))?(?P<op>:=|=(?!=)|:)\s*"
)
_CODE_CAND_I = re.compile(r"(?i)" + _CODE_CAND.pattern)
# Source lines are cut to this length before they are judged (and shown): a minified file's one
# line is not worth a redaction pass of its size (~70 µs for 1,000 characters), and no pane shows
# that much. The cut is made between words, so no part of a token is left to be shown.
MAX_CODE_CHARS = 1000
_CUT_AT = re.compile(r"[\s,;(){}\[\]]")


def _code_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, quote) of the text inside each string literal of one line of Python, and of
    a comment (quote ``#``); an unclosed string runs to the end of the line."""
    spans: list[tuple[int, int, str]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            spans.append((i + 1, n, "#"))
            break
        if c in "\"'":
            q = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else c
            k = i + len(q)
            while k < n and not text.startswith(q, k):
                k += 2 if text[k] == "\\" else 1
            k = min(k, n)
            spans.append((i + len(q), k, q))
            i = k + len(q)
            continue
        i += 1
    return spans


def _cut(line: str) -> str:
    head = line[:MAX_CODE_CHARS]
    seps = [m.start() for m in _CUT_AT.finditer(head)]
    return head[: seps[-1] if seps else 0] + " …"


def _hide_literal(lit: str) -> str:
    """``"x"`` -> ``"***"``, its prefix and quotes kept (an open one is closed); an empty
    literal hides nothing."""
    m = _LIT_HEAD.match(lit)
    if m is None:
        return REDACTED
    head, q = m.group(0), m.group(2)
    body = lit[len(head):]
    if body.endswith(q):  # closed (else left open by the line)
        body = body[: -len(q)]
    return lit if not body else f"{head}{REDACTED}{q}"


def _redact_code_kv(text: str, low: str | None) -> str:
    cands = _CODE_CAND.finditer(low) if low is not None else _CODE_CAND_I.finditer(text)
    spans: list[tuple[int, int, str]] | None = None
    out: list[str] = []
    pos = 0
    for m in cands:
        start = m.start()
        if start < pos:
            continue  # inside a value already hidden
        while start > pos and text[start - 1] in _NAME_CHARS:
            start -= 1
        name_end = m.start("q")
        if not is_secret_name(text[start:name_end].lstrip("-.")):
            continue
        if ":" in text[name_end:m.end()] and _FILE_NAME.search(text, start, name_end) and _LINE_NO.match(text, m.end()):
            continue  # "leak_secret.py:13": a file's line, not a secret's value
        if spans is None:
            spans = _code_spans(text)
        span = next((sp for sp in spans if sp[0] <= start < sp[1]), None)
        if span is not None and not (m.group("q") and span[2] != "#" and name_end == span[1]):
            # Free text inside a string or a comment (a string that is only the name is a key):
            # the command line's reading, within it.
            if m.group("op") == ":=":
                continue
            v = _KV_VAL.match(text, m.end(), span[1])
            if v is None:
                continue
            val = v.group("val")
            out.append(text[pos:v.start("val")])
            out.append(val[0] + REDACTED + val[0] if val[0] in "\"'" else REDACTED)
            pos = v.end()
            continue
        if span is None and m.group("q"):
            continue  # a quote after a name in code opens a string: no assignment here
        v = _CODE_VAL.match(text, m.end())
        if v is None:
            continue  # an expression: where the secret comes from, not the secret
        out.append(text[pos:v.start()])
        if v.group("lit") is not None:
            out.append(_hide_literal(v.group("lit")))
        elif v.group("num") is not None:
            out.append(REDACTED)
        else:
            out.append(_LIT_RE.sub(lambda x: _hide_literal(x.group(0)), v.group("group")))
        pos = v.end()
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


# ``["huggingface-cli", "login", "--token", "X"]``: a secret-named option's value is the next literal.
_CODE_FLAG_LIT = re.compile(r"(?P<q>[\"'])(?P<name>--?[A-Za-z0-9_.\-]+)(?P=q)\s*,\s*")


def _redact_code_flags(text: str) -> str:
    """An option and its value apart in a string literal or a comment (a command line written in
    the code), or as two literals of an argument list; never in the code itself (``-key if x``)."""
    out: list[str] = []
    pos = 0
    for start, end, _ in _code_spans(text):
        body = text[start:end]
        out.append(text[pos:start])
        out.append(_redact_flag_values(body, body.lower() if body.isascii() else None))
        pos = end
    out.append(text[pos:])
    text = "".join(out)
    for m in reversed(list(_CODE_FLAG_LIT.finditer(text))):
        lit = _LIT_RE.match(text, m.end())
        if lit is not None and is_secret_name(m.group("name").lstrip("-")) and not _is_flag(lit.group(0)[1:]):
            text = text[:lit.start()] + _hide_literal(lit.group(0)) + text[lit.end():]
    return text


def redact_code(line: str) -> str:
    """One source line (a stack frame's ``code``) as it may be shown or recorded. The same few
    lines come back in every sample, so each distinct line is judged once (cached, cut first so
    the cache holds no long line)."""
    return _judge_code(line if len(line) <= MAX_CODE_CHARS else _cut(line))


@lru_cache(maxsize=8192)
def _judge_code(text: str) -> str:
    if "://" in text:
        text = _URL_CREDS.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)
    low = text.lower() if text.isascii() else None
    text = _redact_code_kv(text, low)
    if "-" in text:
        text = _redact_code_flags(text)
    if low is None or "cookie" in low:
        text = _COOKIE.sub(lambda m: m.group(1) + REDACTED, text)
    if low is None or "bearer" in low:
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _SHAPES_RE.sub(REDACTED, text)
    return _BLOB_RE.sub(_blob, text) if len(text) >= 40 else text


# --------------------------------------------------------------------------- command lines

# --flag=value, KEY=value, Hydra overrides (a.b.c=value, +a=, ++a=, ~a=) as one argument.
_FLAG_EQ = re.compile(r"^(--?[A-Za-z0-9_\-.]+|[+~]{0,2}[A-Za-z_][\w.\-/@]*)=(.*)$", re.S)

# Programs whose short options carry a password where the spelling is unambiguous. Only by the
# program's name: ``-p`` is a port or a path everywhere else.
# mysql-family: ``-pSECRET`` attached (a bare ``-p`` prompts; ``-p NAME`` names a database).
_ATTACHED_P = frozenset({"mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlcheck",
                         "mysqlshow", "mysqlpump", "mysqlsh", "mariadb", "mariadb-dump",
                         "mariadb-admin"})
# option -> how its next argument is hidden: "all", or "after:" (curl -u user:password).
_NEXT_OPTS: dict[str, dict[str, str]] = {
    "sshpass": {"-p": "all"},  # sshpass -p PASSWORD
    "redis-cli": {"-a": "all"},  # redis-cli -a PASSWORD
    "curl": {"-u": "after:", "--user": "after:", "-U": "after:", "--proxy-user": "after:"},
}
_SCHEMES = frozenset({"bearer", "basic", "digest", "token", "negotiate"})


def _is_flag(arg: str) -> bool:
    """An option, not a value (a value after a secret flag is hidden unless it is the next flag:
    ``--use_auth_token --model x`` hides nothing). Negative numbers are values."""
    return len(arg) > 1 and arg[0] == "-" and not arg[1].isdigit() and arg[1] != "."


_PUNCT = re.compile(r"^([\"']?)(.*?)([\"']?[,;}\]]*)$", re.S)


def _hide(arg: str) -> str:
    """A whole argument hidden, its JSON punctuation kept (``"x",`` -> ``"***",``)."""
    m = _PUNCT.match(arg)
    return f"{m.group(1)}{REDACTED}{m.group(3)}" if m and m.group(2) else REDACTED


def _open_quote(arg: str, quote: str) -> str:
    """The quote still open after ``arg`` (a hidden value continues past whitespace)."""
    for c in arg:
        if quote:
            if c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
    return quote


def _redact_args(argv: list[str] | tuple[str, ...], split_values: bool = True) -> list[str]:
    """The argument-wise pass: values of secret-named flags and assignments, program options,
    and (``split_values``) a value split from its name at whitespace (``Authorization:``
    ``Bearer`` ``X``; ``"password":`` ``"X",``). Shapes and text inside arguments are left to
    redact_text, which sees the same split values again when it runs over the joined line."""
    out: list[str] = []
    hide = ""  # how the next argument is hidden: "", "all", "after:", "scheme" (a scheme may come first)
    quote = ""  # the quote a hidden value split at whitespace has left open
    prog = os.path.basename(argv[0]) if argv else ""
    attached_p = prog in _ATTACHED_P
    next_opts = _NEXT_OPTS.get(prog)
    for arg in argv:
        if hide:
            how, hide = hide, ""
            if not _is_flag(arg):
                if how == "scheme" and arg.lower() in _SCHEMES:
                    out.append(arg)
                    hide = "all"
                elif how == "after:":
                    user, colon, _ = arg.partition(":")
                    out.append(f"{user}:{REDACTED}" if colon else arg)
                else:
                    out.append(_hide(arg))
                    # a value split further: "two words", or a cookie list a=1; b=2
                    if arg.endswith(";") or (quote := _open_quote(arg, quote)):
                        hide = "all"
                continue
        if "=" in arg:
            m = _FLAG_EQ.match(arg)
            if m:
                name = m.group(1)
                if is_secret_name(name.lstrip("-+~")):
                    out.append(f"{name}={REDACTED}")
                else:
                    out.append(arg)
                continue
        if arg[:1] == "-":
            if next_opts and arg in next_opts:
                hide = next_opts[arg]
            elif attached_p and arg[:2] == "-p" and len(arg) > 2:
                out.append("-p" + REDACTED)
                continue
            elif prog == "sshpass" and arg[:2] == "-p" and len(arg) > 2:
                out.append("-p" + REDACTED)
                continue
            elif is_secret_name(arg.lstrip("-")):
                hide = "all"
        elif not split_values:
            pass
        elif arg[-1:] == ":" and is_secret_name(arg.strip("\"'{,: ")):
            hide = "scheme"  # Authorization: | "password": | api_key:
        elif arg.lower() == "bearer":
            hide = "all"
        out.append(arg)
    return out


def redact_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """Redact a command line argument by argument: values of secret-named flags, secret-named
    keys and secret-looking tokens inside each argument."""
    return [redact_text(a) for a in _redact_args(argv)]


def redact_cmdline(argv: list[str] | tuple[str, ...]) -> str:
    """A command line as one string, redacted. The text pass runs over the joined line, so a
    header or JSON that was one argument, or was split at whitespace (py-spy's header, a
    recording's second pass), is judged the same."""
    return redact_text(" ".join(_redact_args(argv, split_values=False)))


# Environment keys that matter for performance: shown (redacted) in the process detail and used
# by the advisor (CUDA_LAUNCH_BLOCKING, OMP_NUM_THREADS, NCCL_*, PYTORCH_CUDA_ALLOC_CONF, ...).
PERF_ENV_PREFIXES = ("CUDA_", "NCCL_", "OMP_", "MKL_", "PYTORCH_", "TORCH_", "NVIDIA_", "OPENBLAS_", "TF_")


def perf_env(environ: dict[str, str]) -> tuple[tuple[str, str], ...]:
    items = [
        (k, redact_value(k, v)) for k, v in environ.items() if k.startswith(PERF_ENV_PREFIXES)
    ]
    return tuple(sorted(items))
