"""The process ncu profiles (:mod:`kerngen.harness.gpu.profile`): build the problem as a worker
does, bind one fresh input set, and call the plan ``warmups + 1`` times on one stream.

    python -m kerngen.harness.gpu.profile_target REQUEST.json

It binds and launches through the worker's own code (:class:`~.check.ProblemState`,
:class:`~.launcher.LoadedModule`, :class:`~.launcher.PlanRunner`): what is profiled is exactly
what is timed. Its stdout is ncu's (the CSV the runner parses), so everything it or a library
prints goes to stderr. Its outcome is also written to the request's ``status_path`` (a
:class:`~.profile.TargetStatus`), so that a problem that does not build or a refused launch is
reported as such rather than as "no kernel profiled". Correctness is not its business: the node
was checked before it was profiled.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch

from kerngen.problems.load import load_problem
from kerngen.problems.torch_modes import strict_fp32

from kerngen.harness.gpu.check import ProblemState
from kerngen.harness.gpu.evaluate import fresh_seeds
from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner
from kerngen.harness.gpu.profile import ProfileRequest, TargetStatus


def run(req: ProfileRequest) -> int:
    """Call the plan ``warmups + 1`` times; returns the calls made."""
    strict_fp32()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    state = ProblemState(load_problem(req.problem), device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        module = LoadedModule(req.cubin(), sorted({l.kernel for l in req.plan.launches}))
        bound = state.new_set(fresh_seeds(1)[0], req.plan)
        runner = PlanRunner(module, req.plan, bound.tensors(state.params), stream)
        torch.cuda.synchronize(device)  # the inputs are made: only the plan's launches follow
        calls = req.warmups + 1
        for _ in range(calls):
            runner()
        stream.synchronize()
    return calls


def _write(path: str, status: TargetStatus) -> None:
    if path:
        try:
            Path(path).write_text(status.model_dump_json())
        except OSError:
            pass  # the runner then says what ncu said


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    os.dup2(2, 1)  # ncu's stdout carries the CSV: keep this process's prints off it
    sys.stdout = sys.stderr
    if len(args) != 1:
        print("usage: python -m kerngen.harness.gpu.profile_target REQUEST.json", file=sys.stderr)
        return 2
    req = ProfileRequest.model_validate_json(Path(args[0]).read_text())
    try:
        calls = run(req)
    except BaseException as exc:  # noqa: BLE001 - the boundary: every failure becomes the status
        first = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
        _write(req.status_path, TargetStatus(error=" ".join((first[-1] if first else type(exc).__name__).split())[:300]))
        traceback.print_exc()
        return 3
    _write(req.status_path, TargetStatus(ok=True, calls=calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
