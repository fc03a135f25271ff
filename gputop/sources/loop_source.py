"""What the loop around a sampled line keeps from one turn to the next, read from the source.

A line that keeps a step's tensor (``total_loss += loss``, ``outputs.append(out)``,
``cache[step] = x``) runs for microseconds: a sampler at a few dumps a second almost never
catches it, so the stacks alone cannot name the line a leak comes from. The loop that encloses the
line the sampler did catch (a forward, a sleep, a data wait) is in the same file, though: its
statements that add to something living across its turns are read here once per file, and each
sampled frame of the user's code carries those of its innermost loop (``Frame.keeps``), and
the loop's first line (``Frame.loop``: which of a function's loops the sample is in). Whether
one of them is the leak is the analysis' judgement (``analysis.memory_cause``); this only reads.

Pure: the file's lines in, ``(line number, statement's first line)`` pairs out.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import NamedTuple

# A loop's keepers are capped: a loop of hundreds of statements keeps its first ones, enough to
# name a leak (one of them), bounded per frame in memory and in a recording.
MAX_KEEPS = 12
MAX_CODE = 200
# Methods that add to a container in place, and those that take from it.
_GROWS = frozenset({"append", "extend", "insert", "add", "update", "appendleft", "setdefault"})
_SHRINKS = frozenset({"pop", "popleft", "popitem", "clear", "remove", "discard"})
# Names a step function's key usually changes by from one call to the next.
_STEP_NAMES = frozenset({"step", "global_step", "i", "idx", "batch_idx", "it"})

Keeps = tuple[tuple[int, str], ...]


# A loop that accumulates gradients: its optimizer steps once every k turns (the gate's line, k
# (0: not read from the source), the gate's condition as written, the lines of its backwards that
# sync every micro-batch, those under a context that skips it).
Accum = tuple[int, int, str, tuple[int, ...], tuple[int, ...]]


# A loop that keeps its rank's part of each batch it loaded (``x = x.chunk(world)[rank]``,
# ``x[rank::world]``): every rank loads the whole global batch. (line, statement as written).
Shard = tuple[int, str]


class _Loop:
    __slots__ = ("first", "last", "keeps", "freed", "accum", "shard")

    def __init__(self, first: int, last: int, keeps: Keeps, freed: tuple[int, ...] = (),
                 accum: Accum | None = None, shard: Shard | None = None) -> None:
        self.first, self.last, self.keeps, self.freed, self.accum, self.shard = first, last, keeps, freed, accum, shard


# A keeper that adds the very tensor a backward ran on in the same turn (``total_loss += loss``
# after ``loss.backward()``): backward freed the activations its graph held, so the sum keeps the
# graph's nodes (a few KB a step) and a scalar, not the step's activations. A leak, but a slow one:
# told apart from a keeper whose graph no backward ever freed (a validation loss summed without
# no_grad keeps every activation of every batch).


def _backward_names(nodes) -> set[str]:
    """Names a ``.backward(...)`` call among ``nodes`` runs on (its receiver or its arguments:
    ``loss.backward()``, ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``),
    unless it keeps the graph (``retain_graph=True``)."""
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward":
            if any(k.arg in ("retain_graph", "create_graph") and not (isinstance(k.value, ast.Constant)
                                                                       and not k.value.value) for k in n.keywords):
                continue
            out |= _names(n.func.value)
            for a in n.args:
                out |= _names(a)
    return out


def _backward_returners(tree: ast.AST) -> set[str]:
    """Functions of the file that run a backward on a name they return (``def train_step(): ...
    loss.backward(); ...; return loss``)."""
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = list(ast.walk(fn))
            ran = _backward_names(body)
            if ran and any(isinstance(n, ast.Return) and n.value is not None and _names(n.value) & ran for n in body):
                out.add(fn.name)
    return out


def _added_name(n: ast.stmt) -> str | None:
    """The bare name a keeper adds (``total += loss``, ``total = total + loss``, ``xs.append(loss)``)."""
    value = None
    if isinstance(n, ast.AugAssign):
        value = n.value
    elif isinstance(n, ast.Assign) and isinstance(n.value, ast.BinOp):
        value = n.value.right
    elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and len(n.value.args) == 1:
        value = n.value.args[0]
    return value.id if isinstance(value, ast.Name) else None


def _freed(keepers: list[ast.stmt], scope: ast.AST, returners: set[str]) -> tuple[int, ...]:
    """The keepers' lines that add a tensor a backward in ``scope`` (a loop, or a function's body)
    ran on, or one a function of the file returns after its backward (``loss = train_step()``)."""
    nodes = list(_body_nodes(scope))
    ran = _backward_names(nodes)
    for n in nodes:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call):
            f = n.value.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in returners:
                for t in n.targets:
                    ran |= _names(t)
    return tuple(k.lineno for k in keepers if _added_name(k) in ran)


# What skips the gradient all-reduce of a micro-batch: a context around its backward (DDP's, FSDP1's
# and accelerate's ``no_sync()``, accelerate's ``accumulate()``, Lightning Fabric's
# ``no_backward_sync()``), or a switch set anywhere in the file (the reducer's
# ``require_backward_grad_sync``, FSDP2's ``set_requires_gradient_sync``, DeepSpeed's boundary
# flag), which a reading of the source cannot place in time: a file that sets one is not read as
# accumulating without. Attributes only: a function of the user's named ``accumulate`` is not accelerate's.
_SKIP_CONTEXTS = frozenset({"no_sync", "accumulate", "no_backward_sync"})
_SKIP_SWITCHES = frozenset({"set_requires_gradient_sync", "require_backward_grad_sync",
                            "set_gradient_accumulation_boundary"})


def _mentions(node: ast.AST, attrs: frozenset[str]) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in attrs for n in ast.walk(node))


def _int_names(tree: ast.AST) -> dict[str, int]:
    """Names the file binds to one int literal and nothing else (``accum_steps = 8``): a gate's k."""
    seen: dict[str, set] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    v = n.value.value if isinstance(n.value, ast.Constant) else None
                    seen.setdefault(t.id, set()).add(v if isinstance(v, int) and not isinstance(v, bool) else None)
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1 and None not in v}


def _gate_k(test: ast.AST, ints: dict[str, int]) -> int | None:
    """k of a test with ``... % k`` in it (0: k not read); None: no modulo in the test."""
    for n in ast.walk(test):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod):
            r = n.right
            if isinstance(r, ast.Constant) and isinstance(r.value, int) and not isinstance(r.value, bool):
                return r.value if r.value > 1 else 0
            if isinstance(r, ast.Name) and ints.get(r.id, 0) > 1:
                return ints[r.id]
            return 0
    return None


def _calls(nodes, attr: str) -> list[ast.Call]:
    return [n for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr]


def _assigned(loop: ast.AST) -> dict[str, ast.expr]:
    """Names the loop's body binds (``boundary = (i + 1) % accum == 0``, ``ctx = model.no_sync()``):
    the expression each was last bound to, in source order."""
    out: dict[str, ast.expr] = {}
    for n in sorted((n for n in _body_nodes(loop) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        for t in n.targets:
            if isinstance(t, ast.Name):
                out[t.id] = n.value
    return out


def _gate_test(test: ast.expr, names: dict[str, ast.expr]) -> ast.expr:
    """The test as its modulo is written: a name bound in the loop (``if boundary:``) read as what it
    was bound to."""
    inner = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else test
    if isinstance(inner, ast.Name) and inner.id in names:
        return names[inner.id]
    return test


def _skipped(loop: ast.AST, names: dict[str, ast.expr]) -> set[int]:
    """The ids of the nodes under a ``with`` that skips the sync (``with model.no_sync():``, ``with
    nullcontext() if last else model.no_sync():``, or ``with ctx:`` where the loop bound ``ctx`` to one)."""
    out: set[int] = set()
    for w in _body_nodes(loop):
        if not isinstance(w, (ast.With, ast.AsyncWith)):
            continue
        exprs = [it.context_expr for it in w.items]
        exprs += [names[e.id] for e in exprs if isinstance(e, ast.Name) and e.id in names]
        if any(_mentions(e, _SKIP_CONTEXTS) for e in exprs):
            out |= {id(n) for n in _body_nodes(w)}
    return out


def _accumulation(loop: ast.For | ast.AsyncFor | ast.While, text: str, ints: dict[str, int]) -> Accum | None:
    """Gradient accumulation as written in a loop: a ``.backward(...)`` every turn and a
    ``.step(...)`` only under an ``if`` whose test takes a modulo (``if (i + 1) % accum == 0:``, or
    a name the loop bound to one). Under DDP or FSDP every backward not under a skipping context
    all-reduces (or reduce-scatters) the gradients. The backwards' lines are kept apart: those
    that sync and those that skip, since a file may hold both (a flag's two branches) and only the
    stacks tell which one runs."""
    names = _assigned(loop)
    gates = [(n, _gate_test(n.test, names)) for n in _body_nodes(loop) if isinstance(n, ast.If)]
    gates = [(n, t) for n, t in gates if _gate_k(t, ints) is not None and _calls(_body_nodes(n), "step")]
    if not gates:
        return None
    gate, test = min(gates, key=lambda g: g[0].lineno)
    inside = {id(n) for g, _ in gates for n in _body_nodes(g)}
    backwards = [c for c in _calls(_body_nodes(loop), "backward") if id(c) not in inside]
    if not backwards:
        return None
    skipped = _skipped(loop, names)
    syncing = tuple(sorted({c.lineno for c in backwards if id(c) not in skipped}))
    if not syncing:
        return None
    quiet = tuple(sorted({c.lineno for c in backwards if id(c) in skipped} - set(syncing)))
    cond = " ".join((ast.get_source_segment(text, test) or "").split())[:MAX_CODE]
    return gate.lineno, _gate_k(test, ints) or 0, cond, syncing, quiet


_SPLITS = frozenset({"chunk", "split", "tensor_split", "array_split"})


def _ranky(node: ast.AST) -> bool:
    """An expression naming this process's rank: ``rank``, ``local_rank``, ``self.rank``,
    ``dist.get_rank()``, ``accelerator.process_index``."""
    for n in ast.walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        if "rank" in name.lower() or name in ("process_index", "local_process_index"):
            return True
    return False


def _shard(loop: ast.For | ast.AsyncFor | ast.While, text: str, sampler: bool = False) -> Shard | None:
    """The first statement of the loop that keeps its rank's part of something it split
    (``feats = feats.chunk(world)[rank]``, ``torch.chunk(x, n)[rank]``, ``x[rank::world]``,
    ``x[rank * n:(rank + 1) * n]``): the batch was loaded whole, on every rank. ``sampler``: the
    file makes a DistributedSampler; a split under an ``if`` of the loop is then a flag's other
    branch (``if not args.sampler:``), which the stacks cannot tell from the one that runs (the
    split runs for microseconds), and is not read."""
    conditional = {id(x) for n in _body_nodes(loop) if isinstance(n, ast.If) for x in _body_nodes(n)}
    for n in sorted((n for n in _body_nodes(loop) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        if sampler and id(n) in conditional:
            continue
        v = n.value
        if not isinstance(v, ast.Subscript):
            continue
        split = isinstance(v.value, ast.Call) and isinstance(v.value.func, ast.Attribute) and v.value.func.attr in _SPLITS
        strided = isinstance(v.slice, ast.Slice) and v.slice.lower is not None and _ranky(v.slice.lower)
        if (split and _ranky(v.slice)) or strided:
            return n.lineno, _statement(text, n)
    return None


def _body_nodes(loop: ast.AST):
    """The loop's statements and expressions, not those of functions or classes defined in it."""
    stack = list(ast.iter_child_nodes(loop))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _root(node: ast.AST) -> str | None:
    """The name a target hangs from: ``self.cache[k]`` -> ``self.cache``, ``xs`` -> ``xs``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


_CONTAINERS = frozenset({"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque"})


def _inits(tree: ast.AST) -> dict[str, str]:
    """How the file makes its names: "grows" for an empty-able container (``{}``, ``[]``,
    ``dict()``, ``defaultdict(list)``), "bounded" for a deque with a ``maxlen``, "other" else."""
    out: dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            targets, value = n.targets, n.value
        elif isinstance(n, ast.AnnAssign) and n.value is not None:
            targets, value = [n.target], n.value
        else:
            continue
        kind = "other"
        if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
            kind = "grows"
        elif isinstance(value, ast.Call):
            fn = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
            if fn in _CONTAINERS:
                kind = "bounded" if any(k.arg == "maxlen" for k in value.keywords) or (
                    fn == "deque" and len(value.args) > 1) else "grows"
        for t in targets:
            root = _root(t) if isinstance(t, (ast.Name, ast.Attribute)) else None
            if root is not None and out.get(root) != "grows":
                out[root] = kind
    return out


def _keepers(loop: ast.For | ast.AsyncFor | ast.While, inits: dict[str, str]) -> list[ast.stmt]:
    """The lines of ``loop`` that add to something that outlives a turn: a sum (``x += v``,
    ``x = x + v``), a container grown in place (``xs.append(v)``), an item stored under a key that
    changes every turn (``cache[step] = v``). A name bound afresh in the loop (``outs = []``) is
    the turn's own, and one the loop also takes from (``pop``, ``del``, ``clear``) is bounded."""
    nodes = list(_body_nodes(loop))
    fresh: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _SHRINKS:
            fresh.add(_root(n.func.value) or "")
        elif isinstance(n, ast.Delete):
            fresh.update(_root(t) or "" for t in n.targets)
    turning: set[str] = _names(loop.target) if isinstance(loop, (ast.For, ast.AsyncFor)) else set()
    for n in nodes:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, (ast.Name, ast.Attribute)) and not (
                        isinstance(n.value, ast.BinOp) and _root(n.value.left) == _root(t)):
                    fresh.add(_root(t) or "")
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            turning.add(n.target.id)  # a counter: step += 1
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
            turning |= _names(n.target)
    out = []
    for n in nodes:
        root = None
        if isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Add, ast.BitOr)):
            root = _root(n.target)
            if isinstance(n.target, ast.Name) and isinstance(n.value, ast.Constant):
                root = None  # a counter, not a sum of values
        elif isinstance(n, ast.Assign) and len(n.targets) == 1:
            t = n.targets[0]
            if isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Add) and _root(n.value.left) == _root(t) \
                    and not isinstance(n.value.right, ast.Constant):
                root = _root(t)
            elif isinstance(t, ast.Subscript) and _names(t.slice) & turning and inits.get(_root(t.value) or "") == "grows":
                # a dict or list made empty and filled under a new key each turn (a tensor
                # written in place, x[i] = v, keeps its size)
                root = _root(t.value)
        elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute) \
                and n.value.func.attr in _GROWS:
            root = _root(n.value.func.value)
            if inits.get(root or "") == "bounded":
                root = None  # deque(maxlen=N): it drops as it takes
        if root is not None and root not in fresh:
            out.append(n)
    return sorted(out, key=lambda n: n.lineno)


def _escaping(fn: ast.FunctionDef | ast.AsyncFunctionDef, inits: dict[str, str]) -> list[ast.stmt]:
    """The statements of a function (outside its loops: those are the loops' own) that add to
    something living beyond the call: ``self.history.append(out)``, ``cache[step] = h`` into a
    module's dict, ``total += loss`` into an attribute. Called once a step from the training loop,
    such a line grows what it adds to every step, as a loop's keeper does."""
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    local: set[str] = set()
    nodes = []
    stack = list(fn.body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.For, ast.AsyncFor,
                          ast.While)):
            continue
        nodes.append(n)
        stack.extend(c for c in ast.iter_child_nodes(n) if isinstance(c, ast.stmt))
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if isinstance(t, ast.Name):
                    local.add(t.id)
    out = []
    for n in nodes:
        root = None
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute) \
                and n.value.func.attr in _GROWS:
            root = _root(n.value.func.value)
            if inits.get(root or "") == "bounded":
                root = None
        elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Subscript):
            t = n.targets[0]
            root = _root(t.value) or ""
            # A new key a call (one the caller passes, or a step counter), into a dict or list the
            # file makes empty, an attribute made elsewhere, or the caller's own container.
            new_key = bool(_names(t.slice) & (params | _STEP_NAMES))
            container = (inits.get(root) == "grows" or ("." in root and root not in inits) or root in params)
            if not (new_key and container):
                root = None
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add) and not isinstance(n.value, ast.Constant):
            root = _root(n.target) if isinstance(n.target, ast.Attribute) else None
        if root is None:
            continue
        base = root.split(".")[0]
        if base in local and base not in params:
            continue  # the call's own
        out.append(n)
    return sorted(out, key=lambda n: n.lineno)


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def read_file(text: str) -> tuple[list[_Loop] | None, int]:
    """A file's loops (``loops_of``) and its line turning cuDNN off (``cudnn_off_line``), from one
    parse: (None, 0) for what is not Python we can parse."""
    tree = _parse(text)
    if tree is None:
        return None, 0
    return _loops_in(tree, text), _cudnn_off_in(tree)


def loops_of(text: str) -> list[_Loop] | None:
    """Every loop of a file with its keepers' line numbers; None: not Python we can parse."""
    return read_file(text)[0]


def _loops_in(tree: ast.Module, text: str) -> list[_Loop]:
    out = []
    inits = _inits(tree)
    returners = _backward_returners(tree)
    skips, ints = _mentions(tree, _SKIP_SWITCHES), _int_names(tree)
    sampler = any((isinstance(n, ast.Name) and n.id == "DistributedSampler")
                  or (isinstance(n, ast.Attribute) and n.attr == "DistributedSampler")
                  or (isinstance(n, ast.alias) and n.name == "DistributedSampler") for n in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            kept = _keepers(node, inits)[:MAX_KEEPS]
            keeps = tuple((n.lineno, _statement(text, n)) for n in kept)
            accum = None if skips else _accumulation(node, text, ints)
            out.append(_Loop(node.lineno, node.end_lineno or node.lineno, keeps, _freed(kept, node, returners), accum,
                             _shard(node, text, sampler)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # A function's body as a "loop" of one turn a call (first = 0: not a loop of its own):
            # what it adds to outside itself, for a line of it outside any loop.
            kept = _escaping(node, inits)[:MAX_KEEPS]
            keeps = tuple((n.lineno, _statement(text, n)) for n in kept)
            if keeps:
                out.append(_Loop(-node.lineno, node.end_lineno or node.lineno, keeps, _freed(kept, node, returners)))
    return out


def _statement(text: str, node: ast.stmt) -> str:
    """The statement as written, without its comment, on one line (capped)."""
    seg = ast.get_source_segment(text, node) or ""
    return " ".join(seg.split())[:MAX_CODE]


def _inner(loops: Sequence[_Loop] | None, lineno: int, calls: bool = True) -> _Loop | None:
    """The innermost loop around ``lineno``; with ``calls``, else the innermost function around
    it that adds to something beyond the call (its ``first`` is minus the def's line)."""
    inner = func = None
    for lp in loops or ():
        if lp.first < 0:
            if -lp.first <= lineno <= lp.last and (func is None or -lp.first >= -func.first):
                func = lp
        elif lp.first <= lineno <= lp.last and (inner is None or lp.first >= inner.first):
            inner = lp
    if inner is not None and (func is None or inner.first >= -func.first):
        return inner
    return func if calls else inner


def keeps_at(loops: Sequence[_Loop] | None, lineno: int) -> Keeps:
    """The keepers of the innermost loop around ``lineno`` (empty: none, or no loop there)."""
    inner = _inner(loops, lineno)
    return inner.keeps if inner is not None else ()


def freed_at(loops: Sequence[_Loop] | None, lineno: int) -> tuple[int, ...]:
    """Those of ``keeps_at``'s lines that add a tensor a backward ran on in the same turn (its
    activations freed: the sum keeps its graph's nodes)."""
    inner = _inner(loops, lineno)
    return inner.freed if inner is not None else ()


def accum_at(loops: Sequence[_Loop] | None, lineno: int) -> Accum | None:
    """The innermost loop around ``lineno``'s gradient accumulation without a skipped sync
    (``_accumulation``), None where it has none."""
    inner = _inner(loops, lineno, calls=False)
    return inner.accum if inner is not None else None


def shard_at(loops: Sequence[_Loop] | None, lineno: int) -> Shard | None:
    """The innermost loop around ``lineno``'s keeping of its rank's part of a loaded batch."""
    inner = _inner(loops, lineno, calls=False)
    return inner.shard if inner is not None else None


def loop_at(loops: Sequence[_Loop] | None, lineno: int) -> int:
    """The first line of the innermost loop around ``lineno`` (0: no loop there): which of a
    function's loops a sample is in (loading shards, training, validating)."""
    inner = _inner(loops, lineno, calls=False)
    return inner.first if inner is not None else 0


class LoopFacts(NamedTuple):
    """All that is read about the loop around one sampled line, in one lookup: what a frame of
    the user's code carries (model.Frame's fields of the same names)."""

    loop: int = 0
    keeps: Keeps = ()
    freed: tuple[int, ...] = ()
    accum: Accum | None = None
    shard: Shard | None = None
    cudnn_off: int = 0  # the file's line turning cuDNN off (0: none); of the file, not the loop


def cudnn_off_line(text: str) -> int:
    """The first line of a file that turns cuDNN off for the process
    (``torch.backends.cudnn.enabled = False``, also through an imported ``cudnn``); 0: none, or
    not Python we can parse. A seeding helper copied between projects does this "for
    reproducibility": every convolution then runs PyTorch's native fallback."""
    return read_file(text)[1]


def _cudnn_off_in(tree: ast.Module) -> int:
    for n in ast.walk(tree):
        if not isinstance(n, ast.Assign) or not (isinstance(n.value, ast.Constant) and n.value.value is False):
            continue
        for t in n.targets:
            if (isinstance(t, ast.Attribute) and t.attr == "enabled"
                    and ((isinstance(t.value, ast.Attribute) and t.value.attr == "cudnn")
                         or (isinstance(t.value, ast.Name) and t.value.id == "cudnn"))):
                return n.lineno
    return 0


def facts_at(loops: Sequence[_Loop] | None, lineno: int) -> LoopFacts:
    """``loop_at``, ``keeps_at``, ``freed_at``, ``accum_at`` and ``shard_at`` of one line."""
    return LoopFacts(loop_at(loops, lineno), keeps_at(loops, lineno), freed_at(loops, lineno),
                     accum_at(loops, lineno), shard_at(loops, lineno))
