"""``kerngen problems FILE --to-dtype bf16 --out DIR`` (issue 35): a KernelBench file's copy that runs in bf16 (or
fp16) loads as an ordinary KernelBench file whose inputs, parameters and output are in that dtype (checked at its
tolerance), is recognised by the playbook as the original is, and the CLI refuses what it cannot copy in one line."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.errors import ProblemError
from kerngen.problems.dtype_copy import dtype_copy, dtype_copy_name
from kerngen.problems.load import load_problem
from tests.cli_output import stderr_of

LINEAR = '''
import torch
import torch.nn as nn

batch_size, in_features, out_features = 16, 32, 24


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x, n: int):
        return torch.relu(self.gemm(x)) * 2.0


def get_inputs():
    return [torch.randn(batch_size, in_features), 3]


def get_init_inputs():
    return [in_features, out_features]
'''


def test_a_bf16_copy_loads_in_bf16_and_keeps_the_forward(tmp_path):
    src = tmp_path / "76_Linear.py"
    src.write_text(LINEAR)
    assert dtype_copy_name(src, "bf16") == "76_Linear_bf16.py"
    copy = tmp_path / "76_Linear_bf16.py"
    copy.write_text(dtype_copy(src, "bf16"))
    p = load_problem(str(copy))
    assert {t.dtype for t in (*p.info.inputs, *p.info.params, *p.info.outputs)} == {"bfloat16"}
    assert (p.info.atol, p.info.rtol) == (1e-2, 1e-2)
    x, n = p.make_inputs("cpu", 0)
    assert x.dtype == torch.bfloat16 and n == 3  # a Python number passes as it is
    model = p.build_model("cpu", 0)
    (out,) = p.run_reference(model, [x, n])
    assert out.dtype == torch.bfloat16 and out.shape == (16, 24)
    from kerngen.agent.playbook import explain

    m = explain(p)
    assert m.family == "gemm16" and m.facts.dtype == "bfloat16" and m.facts.bias == "gemm.bias"


def test_what_cannot_be_copied_is_refused(tmp_path):
    src = tmp_path / "a.py"
    src.write_text(LINEAR)
    with pytest.raises(ProblemError, match="--to-dtype fp64: one of bf16, fp16, fp32"):
        dtype_copy(src, "fp64")
    copy = tmp_path / "a_bf16.py"
    copy.write_text(dtype_copy(src, "bf16"))
    with pytest.raises(ProblemError, match="already a dtype copy"):
        dtype_copy(copy, "fp16")
    (tmp_path / "b.py").write_text("x = 1\n")
    with pytest.raises(ProblemError, match="no 'class Model': not a KernelBench-format file"):
        dtype_copy(tmp_path / "b.py", "bf16")


def test_the_cli_writes_the_copies_and_describes_them(tmp_path):
    runner = CliRunner()
    src = tmp_path / "lin.py"
    src.write_text(LINEAR)
    out = tmp_path / "copies"
    res = runner.invoke(kerngen.cli.app.app, ["problems", str(src), "--to-dtype", "fp16", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert (out / "lin_fp16.py").is_file() and '"dtype": "float16"' in res.stdout
    for args in (["problems", "matmul", "--to-dtype", "bf16", "--out", str(out)], ["problems", "--to-dtype", "bf16"],
                 ["problems", str(src), "--to-dtype", "bf16"]):
        res = runner.invoke(kerngen.cli.app.app, args)
        err = stderr_of(res).strip().splitlines()
        assert res.exit_code == 2 and len(err) == 1 and err[0].startswith("error:"), (args, res.output)
