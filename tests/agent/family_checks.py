"""What every playbook family's GPU test does: build the kernels the playbook offers for a problem
(each offered variant at its offered default, or the round-0 seeds) and assert that the real
harness passes every one of them on that problem."""

from __future__ import annotations

import re
from pathlib import Path

from kerngen.agent.playbook import PlaybookProposer, seed_specs
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef


def offered(ref: ProblemRef, family: str) -> list[Candidate]:
    """Every offered variant of ``family`` at its offered default configuration."""
    prop = PlaybookProposer(load_problem(ref))
    assert prop.match is not None and prop.match.family == family, prop.reason
    cands = [Candidate(spec=v.spec) for v in prop.offer.offered]
    assert cands, f"{family} offered nothing for {ref.label()}"
    return cands


def seeds(ref: ProblemRef) -> list[Candidate]:
    """The playbook's round-0 kernels for ``ref``."""
    specs = seed_specs(load_problem(ref))
    assert specs, f"the playbook rendered nothing for {ref.label()}"
    return [Candidate(spec=s) for s in specs]


# a KernelBench-format problem of one conv module (the conv families' CPU tests): ``ctor`` builds self.conv,
# ``init`` more lines of __init__, ``args`` forward's parameters, ``body`` its lines, ``inputs`` get_inputs's list
CONV_PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = {ctor}
{init}
    def forward(self, {args}):
{body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''


def problem_files(root: Path, template: str, cases: dict[str, tuple], fields: tuple[str, ...], **fixed: str) -> dict:
    """Each case written as a problem file (``template`` formatted with ``fields`` zipped with the
    case's values, and the ``fixed`` ones the same for every case) in ``root`` and loaded: name -> problem."""
    out = {}
    for name, values in cases.items():
        path = root / f"{name}.py"
        path.write_text(template.format(**fixed, **dict(zip(fields, values, strict=True))))
        out[name] = load_problem(str(path))
    return out


def assert_all_pass(pool, ref: ProblemRef, cands: list[Candidate], *, seeds_n: int = 3, budget_ms: float = 30,
                    timeout_s: float = 600) -> None:
    results = pool.evaluate(ref, cands, EvalOptions(seeds=seeds_n, budget_ms=budget_ms, timeout_s=timeout_s))
    bad = [f"{c.spec.name} {r.config}: {r.verdict.value} {r.message}" for c, r in zip(cands, results) if not r.ok]
    assert not bad, "\n".join(bad)


def resized_copy(src: Path, folder: Path, **sizes: int) -> Path:
    """A copy of a KernelBench file in ``folder`` with its module-level size constants replaced
    (each must appear exactly once)."""
    text = src.read_text()
    for k, v in sizes.items():
        text, n = re.subn(rf"^{k}\s*=.*$", f"{k} = {v}", text, flags=re.M)
        assert n == 1, k
    dst = folder / f"{src.stem}_{'_'.join(map(str, sizes.values()))}.py"
    dst.write_text(text)
    return dst


MATMUL_PROBLEM = """
import torch
import torch.nn as nn

M, K, N = {m}, {k}, {n}


class Model(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
"""


def matmul_problem(folder: Path, m: int, k: int, n: int):
    """A KernelBench-format ``A @ B`` of (m, k) by (k, n) fp32 matrices, written in ``folder`` and loaded."""
    path = folder / f"mm_{m}_{k}_{n}.py"
    path.write_text(MATMUL_PROBLEM.format(m=m, k=k, n=n))
    return load_problem(str(path))


# a KernelBench-format problem of one forward expression (the gemm families' CPU tests): ``init`` a line of
# __init__ (modules), every tensor in ``dtype`` (the model moved there once built), inputs made by ``make``
FORWARD_PROBLEM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}
        self.to(torch.{dtype})

    def forward(self, {args}):
        return {forward}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''


def forward_problem(folder: Path, forward: str, inputs: dict[str, tuple[int, ...]], *, init: str = "pass",
                    dtype: str = "float32", make: str = "rand"):
    """``forward`` over inputs of those shapes (``torch.<make>``), written as ``p<n>.py`` in ``folder`` and loaded."""
    path = folder / f"p{len(list(folder.iterdir()))}.py"
    made = ", ".join(f"torch.{make}({s}, dtype=torch.{dtype})" for s in inputs.values())
    path.write_text(FORWARD_PROBLEM.format(init=init, dtype=dtype, args=", ".join(inputs), forward=forward, inputs=made))
    return load_problem(str(path))
