"""Problems as emulator cases: a loaded problem's tensors bound by the harness's names (inputs,
parameters by their dotted names, outputs ``out`` / ``out0`` ...), the outputs preallocated with NaN,
and PyTorch's CPU reference; and one call that emulates a playbook variant and compares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kerngen.agent.playbook import explain, family_of
from kerngen.problems.load import load_problem
from kerngen.problems.problem import Problem
from kerngen.problems.ref import ProblemRef

from tests.emu.runner import emulate

if TYPE_CHECKING:
    import torch

ATOL = RTOL = 1e-4  # the harness's fp32 tolerances


@dataclass
class Case:
    problem: Problem
    tensors: dict[str, "torch.Tensor"]  # what emulate() binds; outputs NaN until a kernel writes them
    refs: dict[str, "torch.Tensor"]  # output name -> PyTorch's result
    sizes: dict[str, int | float]


def load(source: str | Path, shape: tuple[int, ...] | None = None, dtype: str | None = "float32") -> Problem:
    """A built-in by name (with ``shape``/``dtype`` overrides) or a KernelBench-format file by path."""
    if isinstance(source, Path) or "/" in str(source):
        return load_problem(str(source))
    return load_problem(ProblemRef(source=str(source), shape=shape, dtype=dtype))


def make_case(problem: Problem, seed: int = 0) -> Case:
    model = problem.build_model("cpu", seed)
    inputs = problem.make_inputs("cpu", seed + 1)
    outputs = problem.run_reference(model, inputs)
    empty = [_unwritten(o) for o in outputs]
    tensors = {k: v.detach().contiguous() for k, v in problem.bindings(model, inputs, empty).items()}
    out_names = list(problem.bindings(model, inputs, outputs))[-len(outputs):]
    for name, t in zip(out_names, empty):
        tensors[name] = t  # the very tensors the kernel writes
    refs = dict(zip(out_names, outputs))
    return Case(problem, tensors, refs, dict(problem.info.sizes))


def _unwritten(ref: "torch.Tensor") -> "torch.Tensor":
    """An output before the kernel: NaN, or the dtype's largest integer (an unwritten element shows)."""
    import torch

    if ref.is_floating_point():
        return torch.full_like(ref, float("nan"))
    if ref.dtype == torch.bool:
        return torch.zeros_like(ref)
    return torch.full_like(ref, torch.iinfo(ref.dtype).max)


def mismatches(case: Case) -> dict[str, str]:
    """Output name -> why it differs from PyTorch (nothing where it matches within the tolerances)."""
    import torch

    bad = {}
    for name, ref in case.refs.items():
        got = case.tensors[name]
        if not torch.allclose(got.float(), ref.float(), atol=ATOL, rtol=RTOL):
            err = (got.float() - ref.float()).abs().nan_to_num(float("inf"))
            bad[name] = f"max abs error {float(err.max()):.3g} at flat index {int(err.argmax())}"
    return bad


def run_variant(source: str | Path, variant: str, config: dict[str, int] | None = None, *,
                shape: tuple[int, ...] | None = None, seed: int = 0) -> dict[str, str]:
    """Emulate a playbook variant (at its defaults plus ``config``) on a problem; the mismatches."""
    problem = load(source, shape)
    m = explain(problem)
    spec = family_of(m).build(m, variant)
    case = make_case(problem, seed)
    emulate(spec, case.tensors, config=config, sizes=case.sizes)
    return mismatches(case)
