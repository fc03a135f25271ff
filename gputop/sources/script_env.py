"""Environment variables a training script sets for itself, read from its source.

``/proc/PID/environ`` is the environment the process was started with. A script that writes
``os.environ["CUDA_LAUNCH_BLOCKING"] = "1"`` at its top (a debugging leftover: CUDA errors surface
at the line that caused them) changes only its own memory, before CUDA starts and reads it: the
setting rules, which read the environment, never saw it, and a held-out HF Trainer job was told
launch-bound with torch.compile as the fix (unsetting it: 1.58x).

What is read is the main script's statements that run when it starts: its module level, in order,
including the branches of an ``if`` whose test can be decided from the process's own argv and
environment (``"--debug" in sys.argv``, ``__name__ == "__main__"``, ``os.environ.get("X") == "1"``),
and the top level of the functions the module calls by name (``main()``). A setting under a test
that cannot be decided, or in a function nothing calls at module level, is not taken: the rules
that read these settings call them facts.

Pure: the source text, the argv and the starting environment in; (key, value, line) out.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

# A script bigger than this is not read (a generated file, a notebook dump): bounded cost per process.
MAX_SOURCE_BYTES = 2_000_000
# Functions followed from module-level calls, and statements walked: bounded whatever the script.
MAX_FUNCTIONS = 8
MAX_STATEMENTS = 4_000

Setting = tuple[str, str, int]  # (key, value, line)
_UNKNOWN = object()


class _Scan:
    def __init__(self, argv: Sequence[str], environ: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.env: dict[str, str] = dict(environ)
        self.set: dict[str, Setting] = {}
        self.budget = MAX_STATEMENTS

    # ---------------------------------------------------------------- values
    def _const(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)) and not isinstance(node.value, bool):
            return str(node.value)
        return None

    def _test(self, node: ast.AST):
        """True/False where the test is decided by the process's argv and environment; _UNKNOWN otherwise."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            v = self._test(node.operand)
            return _UNKNOWN if v is _UNKNOWN else not v
        if isinstance(node, ast.BoolOp):
            vals = [self._test(v) for v in node.values]
            want = isinstance(node.op, ast.And)
            if any(v is not _UNKNOWN and bool(v) is not want for v in vals):
                return not want  # and: a False decides; or: a True decides
            return _UNKNOWN if any(v is _UNKNOWN for v in vals) else want
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, op, right = node.left, node.ops[0], node.comparators[0]
            if isinstance(op, (ast.In, ast.NotIn)):
                item, box = self._value(left), self._container(right)
                if item is _UNKNOWN or box is _UNKNOWN:
                    return _UNKNOWN
                inside = item in box
                return inside if isinstance(op, ast.In) else not inside
            if isinstance(op, (ast.Eq, ast.NotEq)):
                a, b = self._value(left), self._value(right)
                if a is _UNKNOWN or b is _UNKNOWN:
                    return _UNKNOWN
                return (a == b) if isinstance(op, ast.Eq) else (a != b)
            return _UNKNOWN
        v = self._value(node)
        return _UNKNOWN if v is _UNKNOWN else bool(v)

    def _value(self, node: ast.AST):
        c = self._const(node)
        if c is not None:
            return c
        if isinstance(node, ast.Name) and node.id == "__name__":
            return "__main__"
        if _is_environ_get(node):
            key = self._const(node.args[0]) if node.args else None
            if key is None:
                return _UNKNOWN
            default = self._const(node.args[1]) if len(node.args) > 1 else None
            return self.env.get(key, default)
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = self._const(node.slice)
            return _UNKNOWN if key is None or key not in self.env else self.env[key]
        return _UNKNOWN

    def _container(self, node: ast.AST):
        if _is_sys_argv(node):
            return self.argv
        if _is_environ(node):
            return self.env
        return _UNKNOWN

    # ---------------------------------------------------------------- settings
    def _put(self, key: str | None, value: str | None, line: int, only_if_unset: bool = False) -> None:
        if key is None or value is None or (only_if_unset and key in self.env):
            return
        self.env[key] = value
        self.set[key] = (key, value, line)

    def statement(self, st: ast.stmt, funcs: dict[str, ast.FunctionDef], calls: list[str]) -> None:
        self.budget -= 1
        if self.budget < 0:
            return
        if isinstance(st, ast.Assign):
            for t in st.targets:
                if isinstance(t, ast.Subscript) and _is_environ(t.value):
                    self._put(self._const(t.slice), self._const(st.value), st.lineno)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            call = st.value
            f = call.func
            if isinstance(f, ast.Attribute) and _is_environ(f.value) and f.attr == "setdefault" and len(call.args) == 2:
                self._put(self._const(call.args[0]), self._const(call.args[1]), st.lineno, only_if_unset=True)
            elif isinstance(f, ast.Attribute) and _is_environ(f.value) and f.attr == "update":
                for a in call.args:
                    if isinstance(a, ast.Dict):
                        for k, v in zip(a.keys, a.values):
                            if k is not None:
                                self._put(self._const(k), self._const(v), st.lineno)
                for kw in call.keywords:
                    if kw.arg:
                        self._put(kw.arg, self._const(kw.value), st.lineno)
            elif isinstance(f, ast.Attribute) and f.attr == "putenv" and isinstance(f.value, ast.Name) \
                    and f.value.id == "os" and len(call.args) == 2:
                self._put(self._const(call.args[0]), self._const(call.args[1]), st.lineno)
            elif isinstance(f, ast.Name) and f.id in funcs:
                calls.append(f.id)
        elif isinstance(st, ast.If):
            taken = self._test(st.test)
            if taken is _UNKNOWN:
                return
            for s in (st.body if taken else st.orelse):
                self.statement(s, funcs, calls)
        elif isinstance(st, ast.Try):
            for s in st.body:
                self.statement(s, funcs, calls)
        elif isinstance(st, ast.With):
            for s in st.body:
                self.statement(s, funcs, calls)
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs[st.name] = st  # type: ignore[assignment]


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ`` (``from os import environ``)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os") or (isinstance(node, ast.Name) and node.id == "environ")


def _is_environ_get(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and _is_environ(node.func.value)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getenv"
        and isinstance(node.func.value, ast.Name) and node.func.value.id == "os")


def _is_sys_argv(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "argv" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def env_set_by_script(source: str, argv: Sequence[str], environ: Mapping[str, str]) -> tuple[Setting, ...]:
    """The environment settings ``source`` makes when it runs as ``__main__`` with ``argv`` (its
    own ``sys.argv``: the script's path first) and the starting ``environ``: (key, value, line),
    the last setting of each key. () when the source does not parse."""
    if len(source) > MAX_SOURCE_BYTES:
        return ()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    scan = _Scan(argv, environ)
    funcs: dict[str, ast.FunctionDef] = {}
    calls: list[str] = []
    for st in tree.body:
        scan.statement(st, funcs, calls)
    # Each function once (a `main()` called twice sets the same), at most MAX_FUNCTIONS of them.
    for name in list(dict.fromkeys(calls))[:MAX_FUNCTIONS]:
        for st in funcs[name].body:
            scan.statement(st, {}, [])
    return tuple(sorted(scan.set.values(), key=lambda s: s[2]))


def script_argv(cmdline: Sequence[str]) -> tuple[str, list[str]] | None:
    """The script a Python command line runs and its ``sys.argv``: ``python -u train.py --lr 1``
    -> ("train.py", ["train.py", "--lr", "1"]). None for ``-m``/``-c`` and what is not Python."""
    if not cmdline or "python" not in cmdline[0].rsplit("/", 1)[-1]:
        return None
    i = 1
    while i < len(cmdline):
        a = cmdline[i]
        if a in ("-m", "-c"):
            return None
        if a in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return (a, list(cmdline[i:])) if a.endswith(".py") else None
    return None
