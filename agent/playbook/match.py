"""What every playbook family reads from a problem: its tensors (:class:`Tensor`), the match a
recogniser returns (:class:`FamilyMatch`: the family and the facts its templates need) and the
shared reading of a reference (:class:`Read`: the forward's calls, the meta-built model, the
dtypes), made once per problem by :func:`read_problem`.

The model is only ever built on the meta device (module attributes such as conv geometry and eps,
and the forward for torch.fx, need no weights): reading a problem allocates nothing, whatever its
size. Works on a :class:`kerngen.problems.problem.Problem` and on anything shaped like one:
``.info`` (``inputs``/``params``/``outputs`` of ``TensorInfo(name, shape, dtype)``), ``.source()``,
optionally ``.build_model(device, seed)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kerngen.expr import TensorFacts

from kerngen.agent.playbook.forward_source import Forward, call_kind, init_module_types, read_forward
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["FLOAT_DTYPES", "FamilyMatch", "Read", "Tensor", "pair", "param_for", "read_problem"]

FLOAT_DTYPES = ("float32", "bfloat16", "float16")  # what the playbook's kernels compute in


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class FamilyMatch:
    """A recognised problem: the family and what its templates need."""

    family: str
    inputs: list[Tensor]
    params: list[Tensor]
    outputs: list[Tensor]
    facts: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    @property
    def x(self) -> Tensor:
        return self.inputs[0]

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Bindable name -> shape (inputs, params, outputs as ``out``/``out0``...)."""
        d = {t.name: t.shape for t in self.inputs + self.params}
        for i, t in enumerate(self.outputs):
            d["out" if len(self.outputs) == 1 else f"out{i}"] = t.shape
        return d

    def tensor_facts(self) -> dict[str, TensorFacts]:
        """The same, as what a spec's expressions read (for resolving its plan at these shapes)."""
        return {k: TensorFacts(tuple(v)) for k, v in self.tensors().items()}


# ----------------------------------------------------------------------------------------------
def _dtype(value: Any) -> str:
    return str(value).replace("torch.", "")


def _tensors(items: Any) -> list[Tensor]:
    out = []
    for t in items or []:
        if isinstance(t, dict):
            out.append(Tensor(str(t["name"]), tuple(int(s) for s in t["shape"]), _dtype(t["dtype"])))
        else:
            out.append(Tensor(str(t.name), tuple(int(s) for s in t.shape), _dtype(t.dtype)))
    return out


def _source(problem: Any) -> str:
    src = getattr(problem, "source", "")
    if callable(src):
        src = src()
    return src or ""


def _model(problem: Any) -> Any:
    """The reference module on the meta device (to read conv geometry, eps, ... and trace its
    forward), or None. No weights: nothing is allocated or initialised."""
    cached = getattr(problem, "_playbook_model", None)
    if cached is not None:
        return cached
    if not hasattr(problem, "build_model"):
        return None
    try:
        model = problem.build_model("meta", 0)
    except Exception:  # the file's own code failed on meta tensors (or a KerngenError): no geometry
        return None
    try:
        problem._playbook_model = model
    except AttributeError:  # a read-only stand-in: build again next time
        pass
    return model


def param_for(params: list[Tensor], prefix: str, leaf: str) -> Tensor | None:
    for p in params:
        if p.name == f"{prefix}.{leaf}":
            return p
    return None


# ----------------------------------------------------------------------------------------------
@dataclass
class Read:
    """What ``explain`` read from a problem, shared by the per-family recognisers: the match so far
    (tensors), the forward's calls as (kind, dotted callee, ast.Call), the meta-built model (or None),
    the dtypes of the inputs and the output, the source."""

    match: FamilyMatch
    fwd: Forward
    model: Any
    kinds: list  # (kind, dotted callee, ast.Call) per call in forward
    dtypes: set[str]
    source: str

    @property
    def names(self) -> list[str]:
        return [k for k, _, _ in self.kinds]

    @property
    def out(self) -> Tensor:
        return self.match.outputs[0]



def read_problem(problem: Any) -> Read:
    info = getattr(problem, "info", problem)
    inputs = _tensors(getattr(info, "inputs", None))
    params = _tensors(getattr(info, "params", None))
    outputs = _tensors(getattr(info, "outputs", None))
    source = _source(problem)
    if not inputs or not outputs:
        raise NotCovered("the problem has no tensor inputs or outputs the playbook can read")
    if len(outputs) != 1:
        raise NotCovered("the playbook covers single-output problems only")
    fwd = read_forward(source)
    if fwd is None:
        raise NotCovered("no Model.forward found in the reference source")
    model = _model(problem)
    init_types = init_module_types(source)
    kinds = [(call_kind(model, callee, init_types), callee, node) for callee, node in fwd.calls]
    dtypes = {t.dtype for t in inputs} | {outputs[0].dtype}
    return Read(FamilyMatch("", inputs, params, outputs), fwd, model, kinds, dtypes, source)


def pair(v: Any) -> tuple[int, int]:
    """A module's int-or-pair attribute (kernel_size, stride, ...) as a pair."""
    if isinstance(v, (tuple, list)):
        return int(v[0]), int(v[1])
    return int(v), int(v)
