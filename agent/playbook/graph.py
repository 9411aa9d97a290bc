"""The playbook's front end: a problem's forward traced once into one op graph that every family reads.

``trace(problem)`` runs ``torch.export`` (non-strict) on the model built on the meta device and moved to fake CPU
tensors, with fake inputs: nothing is allocated, no weight is initialised, and the forward's Python runs once
(the same code the reference runs).
The result is the ATen graph of the training IR (``aten.conv2d``, ``aten.linear``, ``aten.softmax``,
``aten.group_norm`` ... are kept whole; in-place ops are functionalised; Python attributes such as
``self.dim`` are constants), rewritten into plain records:

- :class:`Graph`: the forward's tensor inputs (by the forward's argument names), the parameters and buffers
  it reads (by their names in the module's state, as the harness binds them), the one-element tensor
  constants it makes, the non-tensor inputs (a Python float passed to forward is specialised by the trace;
  ``scalars`` keeps its value so a kernel can say it assumed it), the op nodes in execution order, and the
  output.
- :class:`Node`: one ATen op, its arguments by their schema names with the defaults filled in (a tensor
  operand is a :class:`Ref`, the name of an input, a parameter or a node), its output's shape and dtype,
  and the ``nn.Module`` it was called from (path and type: for messages and names only).

A graph runs on real tensors too (:meth:`Graph.run`: every node is its ATen op): the probes of the attention
and scan families and the tests use that. A region of the partitioner (:mod:`.region`) is a graph as well.
This is the one module that touches ``torch.export`` / ``torch.fx``.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from kerngen.agent.playbook.not_covered import NotCovered

# torch.export keeps process-wide state (its proxy dispatch mode slot, the module hierarchy being exported, the
# warnings filter): two traces at once on two threads (a directory run on two GPUs) broke each other. One at a time.
_TRACE_LOCK = threading.Lock()
# real CPU example inputs, where get_inputs cannot run on the meta device, only below this many bytes
_CPU_INPUT_BYTES = 256 << 20
_ITEM_BYTES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "bfloat16": 2, "float16": 2, "bool": 1}

__all__ = ["Graph", "Node", "Ref", "Tensor", "aten_node", "trace", "trace_module"]

FLOAT_DTYPES = ("float32", "bfloat16", "float16")  # what the playbook's kernels compute in


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str


class Ref(str):
    """A tensor operand of a node: the name of a graph input, a parameter, a constant or another node."""

    __slots__ = ()


@dataclass(frozen=True, eq=False)
class Node:
    name: str
    op: str  # the ATen op: "conv2d", "add", "max_pool3d", "getitem", ...
    overload: str  # "default", "Tensor", "Scalar", "dim", ...
    args: dict[str, Any]  # by schema name, defaults filled in; tensors are Refs (lists of them tuples)
    shape: tuple[int, ...] | None  # None: not one tensor (max.dim's (values, indices) pair)
    dtype: str | None
    module: str = ""  # the nn.Module path it was called from ("block.conv"); "" at the top
    module_type: str = ""  # its class name ("Conv2d")
    fn: Callable[..., Any] | None = field(default=None, repr=False)  # the ATen overload

    def __getitem__(self, key: str) -> Any:
        return self.args[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.args.get(key, default)

    @property
    def refs(self) -> list[Ref]:
        """The tensors it reads, in argument order (a list argument's in its order)."""
        out: list[Ref] = []
        for v in self.args.values():
            for x in (v if isinstance(v, tuple) else (v,)):
                if isinstance(x, Ref) and x not in out:
                    out.append(x)
        return out

    @property
    def label(self) -> str:
        where = f" ({self.module})" if self.module else ""
        return f"{self.op}{where}"


@dataclass
class Graph:
    inputs: tuple[Tensor, ...]
    params: tuple[Tensor, ...]
    nodes: tuple[Node, ...]
    output: Ref
    constants: dict[str, float] = field(default_factory=dict)  # one-element tensors made in forward
    scalars: dict[str, int | float] = field(default_factory=dict)  # non-tensor forward inputs, as traced
    trace_s: float = 0.0  # how long the trace took (0 for a region's graph)

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}
        self._tensors = {t.name: t for t in (*self.inputs, *self.params)}
        self._users: dict[str, list[Node]] | None = None

    # -- lookups ------------------------------------------------------------------------------
    def node(self, ref: str) -> Node | None:
        return self._by_name.get(ref)

    def tensor(self, ref: str) -> Tensor | None:
        """The input or parameter ``ref`` names (None for a node, a constant or anything else)."""
        return self._tensors.get(ref)

    def shape(self, ref: str) -> tuple[int, ...] | None:
        n = self.node(ref)
        if n is not None:
            return n.shape
        t = self.tensor(ref)
        return t.shape if t is not None else (() if ref in self.constants else None)

    def dtype(self, ref: str) -> str | None:
        n = self.node(ref)
        if n is not None:
            return n.dtype
        t = self.tensor(ref)
        return t.dtype if t is not None else ("float32" if ref in self.constants else None)

    def users(self, ref: str) -> list[Node]:
        if self._users is None:
            self._users = {}
            for n in self.nodes:
                for r in n.refs:
                    self._users.setdefault(r, []).append(n)
        return self._users.get(ref, [])

    def is_input(self, ref: str) -> bool:
        return any(t.name == ref for t in self.inputs)

    def is_param(self, ref: str) -> bool:
        return any(t.name == ref for t in self.params)

    @property
    def out(self) -> Tensor:
        """The forward's output as the harness names it (``out``)."""
        return Tensor("out", self.shape(self.output) or (), self.dtype(self.output) or "float32")

    def live(self) -> list[Node]:
        """The nodes the output depends on, in order."""
        need: set[str] = set()
        stack = [str(self.output)]
        while stack:
            r = stack.pop()
            n = self.node(r)
            if n is None or r in need:
                continue
            need.add(r)
            stack.extend(n.refs)
        return [n for n in self.nodes if n.name in need]

    def ops(self) -> list[str]:
        return [n.op for n in self.live()]

    @property
    def dtypes(self) -> set[str]:
        return {t.dtype for t in self.inputs} | {self.out.dtype}

    # -- running on tensors -------------------------------------------------------------------
    def run(self, values: dict[str, Any]) -> Any:
        """The output for ``values`` (name -> tensor, for every input and parameter it reads): each node is
        its ATen op, as the trace recorded it."""
        import torch

        env: dict[str, Any] = dict(values)
        env.update({k: torch.tensor(v) for k, v in self.constants.items()})

        def arg(v: Any) -> Any:
            if isinstance(v, Ref):
                return env[v]
            if isinstance(v, tuple):
                return [arg(x) for x in v]
            return v

        for n in self.live():
            if n.fn is None:
                raise NotCovered(f"{n.label} at {n.name} cannot be run")
            if n.op == "getitem":
                env[n.name] = env[n.args["input"]][n.args["index"]]
                continue
            pos, kw = _call_args(n, arg)
            env[n.name] = n.fn(*pos, **kw)
        return env[self.output]


def aten_node(name: str, op: str, overload: str, shape: tuple[int, ...], dtype: str, like: Node, **args: Any) -> Node:
    """A node of ATen op ``op.overload`` made here (not traced): its arguments by schema name, the schema's defaults
    filled in; ``like`` gives it a module (for messages). The partitioner's decompositions and the LSTM family's
    per-layer graphs are made of these."""
    import torch

    fn = getattr(getattr(torch.ops.aten, op), overload)
    full: dict[str, Any] = {}
    for a in fn._schema.arguments:
        full[a.name] = args[a.name] if a.name in args else (a.default_value if a.has_default_value() else None)
    return Node(name, op, overload, full, shape, dtype, like.module, like.module_type, fn)


def _call_args(n: Node, arg: Callable[[Any], Any]) -> tuple[list, dict]:
    pos, kw = [], {}
    for a in n.fn._schema.arguments:
        if a.kwarg_only:
            kw[a.name] = arg(n.args[a.name])
        else:
            pos.append(arg(n.args[a.name]))
    return pos, kw


# ---------------------------------------------------------------------------------------------
def _dtype(d: Any) -> str:
    return str(d).replace("torch.", "")


def _meta(n: Any) -> tuple[tuple[int, ...] | None, str | None]:
    import torch

    v = n.meta.get("val")
    if isinstance(v, torch.Tensor):
        return tuple(int(s) for s in v.shape), _dtype(v.dtype)
    return None, None


def _module(n: Any) -> tuple[str, str]:
    stack = n.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    kind = cls.rsplit(".", 1)[-1] if isinstance(cls, str) else getattr(cls, "__name__", "")
    return str(path).removeprefix("L['self'].").removeprefix("L__self__."), kind


def _normalise(n: Any, names: dict[str, str]) -> tuple[str, str, dict[str, Any], Callable | None]:
    import torch.fx as fx

    def value(v: Any) -> Any:
        if isinstance(v, fx.Node):
            return Ref(names.get(v.name, v.name))
        if isinstance(v, (list, tuple)):
            return tuple(value(x) for x in v) if any(isinstance(x, fx.Node) for x in v) else list(v)
        return v

    if n.target is operator.getitem:
        return "getitem", "default", {"input": value(n.args[0]), "index": n.args[1]}, operator.getitem
    schema = getattr(n.target, "_schema", None)
    if schema is None:
        raise NotCovered(f"the traced forward calls {getattr(n.target, '__name__', n.target)}, which is not an "
                         "ATen op: not covered")
    args: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(n.args) and not a.kwarg_only:
            args[a.name] = value(n.args[i])
        elif a.name in n.kwargs:
            args[a.name] = value(n.kwargs[a.name])
        elif a.has_default_value():
            args[a.name] = value(a.default_value)
        else:
            args[a.name] = None
    return n.target.overloadpacket.__name__, n.target._overloadname, args, n.target


def _info_tensors(items: Any) -> list[Tensor]:
    return [Tensor(str(t.name), tuple(int(s) for s in t.shape), _dtype(t.dtype)) for t in items or []]


def trace(problem: Any) -> Graph:
    """The problem's forward as a :class:`Graph` (traced once per problem object and kept on it), or
    :class:`NotCovered` with the reason the trace failed."""
    cached = getattr(problem, "_playbook_graph", None)
    if cached is not None:
        if isinstance(cached, NotCovered):
            raise cached
        return cached
    try:
        graph = _trace(problem)
    except NotCovered as exc:
        _keep(problem, exc)
        raise
    _keep(problem, graph)
    return graph


def _keep(problem: Any, value: Any) -> None:
    try:
        problem._playbook_graph = value
    except AttributeError:  # a read-only stand-in: trace again next time
        pass


def _trace(problem: Any) -> Graph:
    info = getattr(problem, "info", None)
    if info is None or not hasattr(problem, "build_model") or not hasattr(problem, "make_inputs"):
        raise NotCovered("the problem cannot be traced: it has no model to build on the meta device")
    inputs = _info_tensors(info.inputs)
    params = _info_tensors(info.params)
    outputs = _info_tensors(info.outputs)
    if not inputs or not outputs:
        raise NotCovered("the problem has no tensor inputs or outputs the playbook can read")
    if len(outputs) != 1:
        raise NotCovered("the playbook covers single-output problems only")
    start = time.perf_counter()
    try:
        model = problem.build_model("meta", 0)
        args = _inputs(problem, inputs)
    except Exception as exc:  # the file's own code on the meta device
        first = " ".join(str(exc).split())[:160]
        raise NotCovered(f"cannot build the model on the meta device ({type(exc).__name__}: {first})") from None
    names = list(getattr(problem, "_names_for", lambda n: [f"in{i}" for i in range(n)])(len(args)))
    return _export(model, args, names, inputs, params, start)


def _inputs(problem: Any, inputs: list[Tensor]) -> list:
    """The forward's example inputs on the meta device; where the file's own get_inputs cannot run there (a
    torch.distributions sampler calls .item()), real CPU ones when they are small, as the problem's own
    description falls back (only their shapes and dtypes reach the trace: it makes fake copies)."""
    try:
        return problem.make_inputs("meta", 0)
    except Exception:
        if sum(math.prod(t.shape) * _ITEM_BYTES.get(t.dtype, 8) for t in inputs) > _CPU_INPUT_BYTES:
            raise
        return problem.make_inputs("cpu", 0)


def trace_module(model: Any, args: list, names: list[str] | None = None) -> Graph:
    """The graph of ``model(*args)`` for a module and example inputs (any device; meta tensors allocate
    nothing): inputs named ``names`` (default: the forward's parameter names), parameters and buffers by their
    names in the module's state."""
    import inspect

    import torch

    if names is None:
        sig = [p for p in inspect.signature(model.forward).parameters.values()
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in sig][: len(args)] + [f"in{i}" for i in range(len(sig), len(args))]
    inputs = [Tensor(n, tuple(a.shape), _dtype(a.dtype)) for n, a in zip(names, args) if isinstance(a, torch.Tensor)]
    taken = {t.name for t in inputs}
    params = [Tensor(f"model.{n}" if n in taken else n, tuple(t.shape), _dtype(t.dtype))
              for n, t in [*model.named_parameters(), *model.named_buffers()]]
    return _export(model, list(args), names, inputs, params, time.perf_counter())


def _export(model: Any, args: list, names: list[str], inputs: list[Tensor], params: list[Tensor],
            start: float) -> Graph:
    with _TRACE_LOCK:
        return _export_locked(model, args, names, inputs, params, start)


def _export_locked(model: Any, args: list, names: list[str], inputs: list[Tensor], params: list[Tensor],
                   start: float) -> Graph:
    import warnings

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        # fake CPU tensors (no memory, no values): a tensor the forward makes from a Python number on its input's
        # device (torch.tensor(0.0, device=x.device)) is then a real CPU constant whose value the graph keeps
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = model.to_empty(device="cpu")
            args = [torch.empty_like(a, device="cpu") if isinstance(a, torch.Tensor) else a for a in args]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(model, tuple(args), strict=False)
    except Exception as exc:  # the file's own code, or a limit of the trace: no graph, with the reason
        first = " ".join(str(exc).split())[:160]
        raise NotCovered(f"cannot trace the forward with torch.export ({type(exc).__name__}: {first})") from None
    scalars = {n: a for n, a in zip(names, args) if isinstance(a, (int, float)) and not isinstance(a, bool)}
    return _from_export(ep, inputs, params, scalars, time.perf_counter() - start)


def _from_export(ep: Any, inputs: list[Tensor], params: list[Tensor], scalars: dict[str, int | float],
                 elapsed: float) -> Graph:
    import torch
    from torch.export.graph_signature import InputKind

    sig = ep.graph_signature
    if getattr(sig, "user_inputs_to_mutate", None) or getattr(sig, "buffers_to_mutate", None):
        raise NotCovered("the forward changes an input or a buffer in place: not covered by the playbook")
    taken = {t.name for t in inputs}
    names: dict[str, str] = {}
    constants: dict[str, float] = {}
    user = iter([t.name for t in inputs])
    for spec in sig.input_specs:
        ph = spec.arg.name if hasattr(spec.arg, "name") else None
        if ph is None:
            continue
        if spec.kind == InputKind.USER_INPUT:
            names[ph] = next(user, ph)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            target = str(spec.target)
            names[ph] = f"model.{target}" if target in taken else target
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            value = ep.constants.get(spec.target)
            if isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type != "meta" and (
                    value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
                constants[ph] = float(value.reshape(-1)[0].item())
    nodes: list[Node] = []
    output: Ref | None = None
    for n in ep.graph.nodes:
        if n.op == "call_function" and str(getattr(n.target, "__name__", "")).startswith("_assert"):
            continue  # the trace's own metadata checks: no value
        if n.op == "call_function":
            op, overload, nargs, fn = _normalise(n, names)
            shape, dtype = _meta(n)
            path, kind = _module(n)
            nodes.append(Node(n.name, op, overload, nargs, shape, dtype, path, kind, fn))
        elif n.op == "output":
            outs = n.args[0]
            if len(outs) != 1 or not hasattr(outs[0], "name"):
                raise NotCovered("the forward does not return one tensor (a tuple, a list or a constant)")
            output = Ref(names.get(outs[0].name, outs[0].name))
    if output is None:
        raise NotCovered("the traced forward has no output")
    nodes, rename = _alias_free(nodes)
    nodes, output = _pure(nodes, rename.get(output, output), {t.name for t in (*inputs, *params)})
    return Graph(tuple(inputs), tuple(params), tuple(nodes), output, constants, scalars, elapsed)


_ALIASES = ("lift_fresh_copy", "detach_", "detach", "alias", "clone")
_VIEWS = ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten", "expand", "permute", "transpose", "t",
          "numpy_T", "select", "slice", "narrow", "as_strided")


def _pure(nodes: list[Node], output: Ref, tensors: set[str]) -> tuple[list[Node], Ref]:
    """In-place ops (``relu_``, ``add_``, ...) as their pure twins: the op's result is a new value that every later
    reader of the tensor it changed reads instead. A forward that changes an input, a parameter or a view's base
    is refused (its meaning is not one pure graph)."""
    if not any(n.fn is not None and getattr(getattr(n.fn, "_schema", None), "is_mutable", False) for n in nodes):
        return nodes, output
    import torch

    made = {n.name: n for n in nodes}
    now: dict[str, Ref] = {}  # a changed tensor -> the node holding its value now
    out = []
    for n in nodes:
        n = replace(n, args={k: _renamed(v, now) for k, v in n.args.items()})
        schema = getattr(n.fn, "_schema", None)
        if schema is not None and schema.is_mutable and n.op.endswith("_"):
            target = n.args.get("self")
            src = made.get(target) if isinstance(target, Ref) else None
            if not isinstance(target, Ref) or target in tensors or (src is not None and src.op in _VIEWS):
                raise NotCovered(f"the forward changes {target!r} in place ({n.op}): not covered by the playbook")
            pure = getattr(getattr(torch.ops.aten, n.op[:-1], None), n.overload, None)
            if pure is None:
                raise NotCovered(f"in-place {n.op} has no pure twin the playbook knows")
            n = replace(n, op=n.op[:-1], fn=pure)
            now[str(target)] = Ref(n.name)
        out.append(n)
    return out, now.get(str(output), output)


def _alias_free(nodes: Iterable[Node]) -> tuple[list[Node], dict[str, Ref]]:
    """Nodes that only name another tensor (``lift_fresh_copy`` and ``detach_`` of a constant, ``detach``,
    ``alias``, ``clone``) folded into their users: a later reader sees the tensor itself."""
    rename: dict[str, Ref] = {}
    out = []
    for n in nodes:
        if n.op in _ALIASES and isinstance(n.args.get("self"), Ref) and "channels_last" not in str(n.args.get(
                "memory_format")):
            rename[n.name] = rename.get(n.args["self"], n.args["self"])
            continue
        if rename:
            n = replace(n, args={k: _renamed(v, rename) for k, v in n.args.items()})
        out.append(n)
    return out, rename


def _renamed(v: Any, rename: dict[str, Ref]) -> Any:
    if isinstance(v, Ref):
        return rename.get(v, v)
    if isinstance(v, tuple):
        return tuple(_renamed(x, rename) for x in v)
    return v
