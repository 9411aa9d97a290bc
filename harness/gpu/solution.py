"""A KernelBench solution the user already has (a file with ``class ModelNew``), measured beside
the problem's reference: ``kerngen bench PROBLEM --solution FILE``.

The file is the user's own Python: it is imported and run only because they named it on the
command line, in a process of its own (:func:`run_solution` starts ``python -m`` this module),
never in the harness's GPU workers and never by a search, a replay or a suite. The check is
KernelBench's: ``Model`` and ``ModelNew`` are built from ``get_init_inputs()`` under the same seed
(and ``ModelNew`` takes ``Model``'s weights where its parameters have the same names and shapes),
then compared on fresh random inputs, output by output, at the problem's tolerance; a correct
``ModelNew`` is timed like every candidate (CUDA events, L2 flushed before each repetition, the
median), with the reference's eager time measured beside it in the same process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kerngen.errors import KerngenError
from kerngen.harness.results import Timing, Verdict
from kerngen.problems.ref import ProblemRef
from kerngen.text import one_line

SEEDS = (20261127, 7, 1234567)  # the input sets the outputs are compared on


class SolutionRequest(BaseModel):
    problem: ProblemRef
    solution: str  # the file's path
    seeds: int = 3
    budget_ms: float = 300.0


class SolutionResult(BaseModel):
    verdict: Verdict  # ok | incorrect | runtime_error (the file does not import, has no ModelNew, raises)
    message: str = ""
    timing: Timing | None = None  # ModelNew, when correct
    eager: Timing | None = None  # the reference Model, measured in the same process
    max_abs_err: float | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.ok


def check_solution(problem: Any, module: Any, device: Any, seeds: int = 3) -> tuple[SolutionResult, Any, Any, list]:
    """(result, reference model, ModelNew, the last inputs) of ``module``'s ModelNew against
    ``problem`` (a loaded :class:`~kerngen.problems.problem.Problem`) on ``device``; any device
    (the CPU tier tests it there)."""
    import torch

    from kerngen.harness.gpu.compare import compare
    from kerngen.problems.torch_modes import force_device_mode, seeded

    cls = getattr(module, "ModelNew", None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return SolutionResult(verdict=Verdict.runtime_error, message="the file defines no class ModelNew(nn.Module)"), \
            None, None, []
    dev = torch.device(device)
    built = []
    for what in (problem.module.Model, cls):
        with seeded(0, dev), force_device_mode(dev):
            model = what(*list(problem.module.get_init_inputs()))
        if problem.builtin:
            model = model.to(device=dev, dtype=problem.module.DTYPE)
        built.append(model.to(dev).eval())
    ref_model, new_model = built
    theirs, ours = new_model.state_dict(), ref_model.state_dict()
    if theirs.keys() == ours.keys() and all(theirs[k].shape == ours[k].shape for k in ours):
        new_model.load_state_dict(ours)
    info = problem.info
    worst, inputs = 0.0, []
    for seed in SEEDS[:max(1, seeds)]:
        inputs = problem.make_inputs(dev, seed)
        refs = problem.run_reference(ref_model, inputs)
        with torch.no_grad():
            out = new_model(*inputs)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(outs) != len(refs):
            return SolutionResult(verdict=Verdict.incorrect, message=f"ModelNew gives {len(outs)} outputs, the "
                                  f"reference {len(refs)}"), ref_model, new_model, inputs
        for i, (o, r) in enumerate(zip(outs, refs)):
            if not isinstance(o, torch.Tensor) or o.shape != r.shape or o.dtype != r.dtype:
                got = f"{tuple(o.shape)} {o.dtype}" if isinstance(o, torch.Tensor) else type(o).__name__
                return SolutionResult(verdict=Verdict.incorrect, message=f"output {i}: {got}, expected "
                                      f"{tuple(r.shape)} {r.dtype}"), ref_model, new_model, inputs
            c = compare(o, r, atol=info.atol, rtol=info.rtol, name=f"output {i}")
            worst = max(worst, c.max_abs_err)
            if not c.ok:
                return SolutionResult(verdict=Verdict.incorrect, message=f"seed {seed}: {c.message}",
                                      max_abs_err=c.max_abs_err), ref_model, new_model, inputs
    return SolutionResult(verdict=Verdict.ok, message=f"correct on {len(SEEDS[:max(1, seeds)])} input sets "
                          f"(atol {info.atol:g}, rtol {info.rtol:g})", max_abs_err=worst), ref_model, new_model, inputs


def measure_solution(req: SolutionRequest) -> SolutionResult:
    """In this process: load the problem and the user's file, check ModelNew, time it and the
    reference on the GPU."""
    import torch

    from kerngen.harness.gpu.clocks import ClockMonitor
    from kerngen.harness.gpu.timing import L2Flusher, bench
    from kerngen.problems.load import import_module, load_problem

    problem = load_problem(req.problem)
    try:
        module = import_module(Path(req.solution))
    except KerngenError as exc:
        return SolutionResult(verdict=Verdict.runtime_error, message=one_line(str(exc), 500))
    dev = torch.device("cuda", 0)
    try:
        result, ref_model, new_model, inputs = check_solution(problem, module, dev, req.seeds)
    except Exception as exc:  # noqa: BLE001 - the user's code raising is its verdict, never a traceback
        return SolutionResult(verdict=Verdict.runtime_error, message=one_line(f"{type(exc).__name__}: {exc}", 500))
    if not result.ok:
        return result
    stream, flusher = torch.cuda.Stream(dev), L2Flusher(dev)
    with torch.no_grad(), torch.cuda.stream(stream):
        for name, model in (("timing", new_model), ("eager", ref_model)):
            t = bench(lambda m=model: m(*inputs), stream=stream, flusher=flusher, budget_ms=req.budget_ms,
                      clocks=ClockMonitor(0))
            setattr(result, name, t)
    return result


def run_solution(req: SolutionRequest, timeout_s: float = 900.0) -> SolutionResult:
    """:func:`measure_solution` in a process of its own (the user's Python never runs in kerngen's)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "kerngen.harness.gpu.solution"], input=req.model_dump_json(),
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return SolutionResult(verdict=Verdict.timeout, message=f"--solution took more than {timeout_s:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = one_line(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}", 500)
        return SolutionResult(verdict=Verdict.runtime_error, message=f"the solution's process failed: {tail}")
    return SolutionResult.model_validate_json(lines[-1])


def main() -> None:
    req = SolutionRequest.model_validate_json(sys.stdin.read())
    out = sys.stdout
    sys.stdout = sys.stderr  # what the user's code prints stays off the answer's line
    try:
        result = measure_solution(req)
    except KerngenError as exc:
        result = SolutionResult(verdict=Verdict.runtime_error, message=one_line(str(exc), 500))
    out.write(json.dumps(result.model_dump(mode="json")) + "\n")


if __name__ == "__main__":
    main()
