"""log_softmax joins the softmax family: recognised from torch.log_softmax / nn.LogSoftmax (dim read
from the meta model when the file passes it to __init__), both row kernels render its form and
compile with NVRTC."""

from __future__ import annotations

import textwrap

import pytest

from kerngen.agent.playbook.rows.family import SOFTMAX
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook import explain, family_of
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem

FILE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim
        {module}

    def forward(self, x):
        return {call}

def get_inputs():
    return [torch.rand(64, 4096)]

def get_init_inputs():
    return [{dim}]
"""


def _problem(tmp_path, call, dim=1, module="pass"):
    f = tmp_path / "m.py"
    f.write_text(textwrap.dedent(FILE).format(call=call, dim=dim, module=module))
    return load_problem(str(f))


@pytest.mark.parametrize("call, module", [
    ("torch.log_softmax(x, dim=self.dim)", "pass"),
    ("torch.nn.functional.log_softmax(x, dim=-1)", "pass"),
    ("self.ls(x)", "self.ls = nn.LogSoftmax(dim=1)"),
])
def test_log_softmax_is_the_softmax_family_with_log(tmp_path, call, module):
    m = explain(_problem(tmp_path, call, module=module))
    assert m.family == "softmax" and m.facts.log is True


def test_softmax_is_not_log(tmp_path):
    m = explain(_problem(tmp_path, "torch.softmax(x, dim=self.dim)"))
    assert m.family == "softmax" and m.facts.log is False


def test_log_softmax_over_dim_0_is_decomposed_into_regions(tmp_path):
    """The softmax family refuses another dim than the last; PyTorch's decomposition (max, exp, sum, log) is
    served as regions."""
    p = _problem(tmp_path, "torch.log_softmax(x, dim=self.dim)", dim=0)
    with pytest.raises(NotCovered, match="log_softmax over dim 0"):
        SOFTMAX.recognise(trace(p))
    m = explain(p)
    assert [r.match.family for r in m.facts.partition.regions] == ["reduce", "elementwise", "elementwise", "reduce",
                                                                   "elementwise"]


@pytest.mark.parametrize("variant", ["rows_reg", "long"])
def test_both_row_kernels_render_and_compile_log_softmax(tmp_path, variant):
    m = explain(_problem(tmp_path, "torch.log_softmax(x, dim=self.dim)"))
    spec = family_of(m).build(m, variant, {})
    assert "shift = m + logf(s)" in spec.source and "__expf(f[j] - m) * inv" not in spec.source
    assert spec.description.startswith("log_softmax")
    m = explain(_problem(tmp_path, "torch.softmax(x, dim=self.dim)"))
    plain = family_of(m).build(m, variant, {})
    assert "shift" not in plain.source
    facts = {k: TensorFacts(tuple(v)) for k, v in m.tensors().items()}
    resolved = plan.resolve(spec, sizes={}, tensors=facts, config=spec.default_config())
    compile_job(job_for(spec, resolved, "sm_90"), cache=None)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(64, 4096), (16, 393216), (33, 1000)])
def test_gpu_log_softmax_kernels_pass_the_checks(tmp_path, rows, cols):
    from kerngen.agent.playbook import PlaybookProposer
    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.problems.ref import ProblemRef

    f = tmp_path / "ls.py"
    f.write_text(textwrap.dedent(FILE).format(call="torch.log_softmax(x, dim=self.dim)", dim=1, module="pass")
                 .replace("torch.rand(64, 4096)", f"torch.randn({rows}, {cols}) * 4"))
    prop = PlaybookProposer(load_problem(str(f)))
    cands = [Candidate(spec=b.spec) for e in prop._entries() for b in prop._render(e, None, 2) if b.spec is not None]
    assert cands, prop.reason
    with WorkerPool(timeout_s=120) as pool:
        results = pool.evaluate(ProblemRef(source=str(f)), cands, EvalOptions(seeds=3, budget_ms=30, timeout_s=120))
    bad = [f"{c.spec.name} {r.config}: {r.verdict.value} {r.message}" for c, r in zip(cands, results) if not r.ok]
    assert not bad, "\n".join(bad)
