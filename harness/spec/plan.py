"""Resolve a spec's launch plan against a problem's tensors, sizes and one configuration.

The result holds only integers, floats and names: what the launcher needs, checked on the CPU
before any GPU time is spent (unknown names, zero or oversize grids and blocks, etc.).

Everything here reads a model's answer: :func:`resolve` raises :class:`SpecError` (or its
subclass :class:`~kerngen.errors.ExprError`) for anything a spec can provoke, and never
another exception. Every value it hands on fits where it goes: grid and block within CUDA's
limits, dynamic shared memory and scratch sizes within sane bounds, an ``int32``/``int64``
argument within its type, a ``float32`` argument finite and within float32's range, a
``tensormap`` argument's box rows and columns within 1..256 and its view's dims positive (what the tensor allows is checked
where it is bound, :mod:`kerngen.harness.gpu.tensormap`), a define within 64 bits (or a finite
float) and not named like a CUDA header's reserved names.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Mapping, Sequence

from pydantic import BaseModel

from kerngen import expr
from kerngen.errors import SpecError
from kerngen.expr import TensorFacts
from kerngen.harness.spec.spec import KernelSpec, Launch, Memset, ScalarArg, TensorArg, TensorMapArg

MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_SHARED_MEM = 2**31 - 1  # bytes of dynamic shared memory (a GPU allows far less; prune checks that)
MAX_SCRATCH_ELEMENTS = 2**40  # elements of one scratch buffer (no GPU holds more)
MAX_CLUSTER = 8  # blocks of a thread-block cluster (the portable limit on sm_90)
MAX_TMA_BOX = 256  # rows or columns of a tensormap argument's box (the TMA's limit per dimension)
FLOAT32_MAX = 3.4028234663852886e38
_RESERVED = re.compile(r"^(__|_[A-Z])")  # names of the compiler and the CUDA headers


class ResolvedArg(BaseModel):
    kind: str  # "tensor" | "tensormap" | "int32" | "int64" | "float32"
    name: str | None = None  # the tensor of a "tensor" or "tensormap" argument
    value: int | float | None = None  # a scalar's value
    box: tuple[int, int] | None = None  # a "tensormap": (box_rows, box_cols)
    swizzle: int | None = None  # a "tensormap": 0, 32, 64 or 128 (bytes)
    full_width: bool = True  # a "tensormap": the box spans every column (False: box_cols of them)
    view: tuple[int, ...] | None = None  # a "tensormap": the shape the tensor is viewed as


class ResolvedLaunch(BaseModel):
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    args: list[ResolvedArg]
    cooperative: bool = False
    cluster: int = 1  # blocks of a thread-block cluster along x (the kernel's __cluster_dims__)


class ResolvedMemset(BaseModel):
    tensor: str
    value: int


class ResolvedScratch(BaseModel):
    name: str
    dtype: str
    size: int


class ResolvedPlan(BaseModel):
    config: dict[str, int]
    defines: dict[str, int | float]
    scratch: list[ResolvedScratch]
    steps: list[ResolvedLaunch | ResolvedMemset]

    @property
    def launches(self) -> list[ResolvedLaunch]:
        return [s for s in self.steps if isinstance(s, ResolvedLaunch)]

    def max_threads(self) -> int:
        return max((l.block[0] * l.block[1] * l.block[2] for l in self.launches), default=0)

    def max_shared_mem(self) -> int:
        return max((l.shared_mem for l in self.launches), default=0)


def build_env(
    sizes: Mapping[str, int | float], tensors: Mapping[str, TensorFacts], config: Mapping[str, int]
) -> dict[str, object]:
    """Names visible to expressions: problem sizes, tensors, then tunables (which win)."""
    env: dict[str, object] = dict(sizes)
    env.update(tensors)
    env.update(config)
    return env


def constraints_hold(spec: KernelSpec, env: Mapping[str, object]) -> tuple[bool, str]:
    for text in spec.constraints:
        if not expr.evaluate_bool(text, env):
            return False, f"constraint violated: {text}"
    return True, ""


def resolve(
    spec: KernelSpec,
    *,
    sizes: Mapping[str, int | float],
    tensors: Mapping[str, TensorFacts],
    config: Mapping[str, int] | None = None,
    check_constraints: bool = True,
) -> ResolvedPlan:
    """Resolve every expression; raise :class:`SpecError` with the first problem found.
    ``check_constraints=False``: the caller has just checked them on this full config (static
    pruning does, to tell a violated constraint from a plan that does not resolve)."""
    cfg = spec.full_config(dict(config or {}))
    env = build_env(sizes, tensors, cfg)
    ok, why = constraints_hold(spec, env) if check_constraints else (True, "")
    if not ok:
        raise SpecError(why)
    for name in cfg:
        _check_macro_name("tunable", name)
    defines = {name: _define(name, value, env) for name, value in spec.defines.items()}
    env.update(defines)
    scratch = [
        ResolvedScratch(name=s.name, dtype=s.dtype, size=expr.evaluate_int(s.size, env)) for s in spec.scratch
    ]
    for s in scratch:
        if s.size <= 0:
            raise SpecError(f"scratch {s.name!r} has size {s.size}")
        if s.size > MAX_SCRATCH_ELEMENTS:
            raise SpecError(f"scratch {s.name!r} has {s.size} elements; at most 2**40")
        if s.name in tensors:
            raise SpecError(f"scratch {s.name!r} shadows a problem tensor")
    known = _Bindable(list(tensors), [s.name for s in scratch])
    steps: list[ResolvedLaunch | ResolvedMemset] = []
    for index, step in enumerate(spec.steps):
        if isinstance(step, Memset):
            known.require(step.tensor, f"step {index}: memset")
            steps.append(ResolvedMemset(tensor=step.tensor, value=step.value))
        else:
            steps.append(_resolve_launch(step, env, known, index))
    return ResolvedPlan(config=cfg, defines=defines, scratch=scratch, steps=steps)


def _check_macro_name(what: str, name: str) -> None:
    if _RESERVED.match(name):
        raise SpecError(f"{what} name {name!r} is reserved (names beginning with __ or _X belong to the "
                        "compiler and the CUDA headers)")


def _define(name: str, value: object, env: Mapping[str, object]) -> int | float:
    """A define's value as it will be passed (-DNAME=value): a 64-bit integer or a finite float."""
    _check_macro_name("define", name)
    v = expr.evaluate(value, env)  # type: ignore[arg-type]
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int) and not -(2**63) <= v < 2**64:
        raise SpecError(f"define {name} = {expr.shown(value)} is {expr.shown(v)}, which does not fit 64 bits")
    return v


class _Bindable:
    """The tensors a step may name: the problem's (inputs, parameters, outputs, in its order) and
    the spec's scratch buffers. An unknown name is a :class:`SpecError` that lists them all (the
    model reads it in its repair prompt) and suggests the closest one."""

    SHOWN = 24  # names listed at most (a KernelBench model may have hundreds of parameters)

    def __init__(self, problem: Sequence[str], scratch: Sequence[str]) -> None:
        self.problem, self.scratch = list(problem), list(scratch)
        self.names = set(self.problem) | set(self.scratch)

    def require(self, name: str, where: str) -> None:
        if name in self.names:
            return
        close = difflib.get_close_matches(name, sorted(self.names), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        listed = self._listed(self.problem) or "none"
        scratch = f"; scratch: {self._listed(self.scratch)}" if self.scratch else "; no scratch buffers"
        raise SpecError(f"{where}: unknown tensor {name[:60]!r}{hint}; the tensors a step can bind are the "
                        f"problem's: {listed}{scratch}")

    def _listed(self, names: list[str]) -> str:
        more = f" (+{len(names) - self.SHOWN} more)" if len(names) > self.SHOWN else ""
        return ", ".join(names[: self.SHOWN]) + more


def _dims(values: list, env: Mapping[str, object], what: str, index: int) -> tuple[int, int, int]:
    dims = [expr.evaluate_int(v, env) for v in values] + [1] * (3 - len(values))
    if any(d <= 0 for d in dims):
        raise SpecError(f"step {index}: {what} {tuple(dims)} has a dimension <= 0")
    return dims[0], dims[1], dims[2]


def _resolve_launch(step: Launch, env: Mapping[str, object], known: _Bindable, index: int) -> ResolvedLaunch:
    grid = _dims(step.grid, env, "grid", index)
    block = _dims(step.block, env, "block", index)
    for d, (g, b) in enumerate(zip(grid, block)):
        if g > MAX_GRID[d]:
            raise SpecError(f"step {index}: grid {grid} exceeds the limit {MAX_GRID}")
        if b > MAX_BLOCK[d]:
            raise SpecError(f"step {index}: block {block} exceeds the limit {MAX_BLOCK}")
    if block[0] * block[1] * block[2] > MAX_THREADS_PER_BLOCK:
        raise SpecError(f"step {index}: block {block} has more than {MAX_THREADS_PER_BLOCK} threads")
    smem = expr.evaluate_int(step.shared_mem, env)
    if smem < 0:
        raise SpecError(f"step {index}: shared memory {smem} < 0")
    if smem > MAX_SHARED_MEM:
        raise SpecError(f"step {index}: shared memory {smem} bytes is more than any GPU has")
    cluster = expr.evaluate_int(step.cluster, env)
    if not 1 <= cluster <= MAX_CLUSTER or grid[0] % cluster or (cluster > 1 and step.cooperative):
        raise SpecError(f"step {index}: cluster {cluster} must be 1..{MAX_CLUSTER}, divide the grid's x ({grid[0]}) "
                        "and not be cooperative")
    args: list[ResolvedArg] = []
    for pos, arg in enumerate(step.args):
        if isinstance(arg, TensorArg):
            known.require(arg.name, f"step {index}: kernel '{step.kernel}' argument {pos}")
            args.append(ResolvedArg(kind="tensor", name=arg.name))
        elif isinstance(arg, TensorMapArg):
            where = f"step {index}: kernel '{step.kernel}' argument {pos}"
            known.require(arg.name, where)
            box = (_box(arg.box_rows, "box_rows", env, where), _box(arg.box_cols, "box_cols", env, where))
            view = _view(arg.view, env, where) if arg.view is not None else None
            args.append(ResolvedArg(kind="tensormap", name=arg.name, box=box, swizzle=arg.swizzle,
                                    full_width=arg.full_width, view=view))
        else:
            args.append(_resolve_scalar(arg, env, index))
    return ResolvedLaunch(kernel=step.kernel, grid=grid, block=block, shared_mem=smem, args=args,
                          cooperative=step.cooperative, cluster=cluster)


def _box(text: object, what: str, env: Mapping[str, object], where: str) -> int:
    value = expr.evaluate_int(text, env)  # type: ignore[arg-type]
    if not 1 <= value <= MAX_TMA_BOX:
        shown = expr.shown(value) if isinstance(text, int) else f"{expr.shown(text)} = {expr.shown(value)}"
        raise SpecError(f"{where}: tensormap {what} {shown} is not in 1..{MAX_TMA_BOX}")
    return value


def _view(dims: list, env: Mapping[str, object], where: str) -> tuple[int, ...]:
    view = tuple(expr.evaluate_int(d, env) for d in dims)
    if any(d <= 0 for d in view) or math.prod(view) > MAX_SCRATCH_ELEMENTS:
        raise SpecError(f"{where}: tensormap view {view} has a dim <= 0 or more elements than any tensor")
    return view


def _resolve_scalar(arg: ScalarArg, env: Mapping[str, object], index: int) -> ResolvedArg:
    if arg.kind == "float32":
        raw = expr.evaluate(arg.value, env)
        try:
            f = float(raw)
        except OverflowError:  # an int beyond any float (bounded by expr, but beyond 2**1024 none is)
            f = math.inf
        if not math.isfinite(f) or abs(f) > FLOAT32_MAX:
            raise SpecError(f"step {index}: float32 argument {expr.shown(arg.value)} = {expr.shown(raw)} "
                            "does not fit a float32")
        return ResolvedArg(kind=arg.kind, value=f)
    value = expr.evaluate_int(arg.value, env)
    limit = 2**31 if arg.kind == "int32" else 2**63
    if not -limit <= value < limit:
        raise SpecError(f"step {index}: {arg.kind} argument {arg.value!r} = {value} overflows")
    return ResolvedArg(kind=arg.kind, value=value)
