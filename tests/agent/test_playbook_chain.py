"""Fused elementwise chains in the playbook (CPU tier): recognition of KernelBench-format files,
the translation checked against PyTorch through the IR (a test-only evaluator maps each IR node
back to a torch op; the model's own forward is the reference), NVRTC compilation of the rendered
template for fp32 / bf16 / fp16, and the NotCovered messages. The GPU tier at the bottom runs
the rendered kernels through the harness's checks."""

from __future__ import annotations

import operator
import re
import textwrap
import types
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kerngen.agent.playbook import family_of, PlaybookProposer, explain, why_not
from kerngen.agent.playbook.chain_ir import ALL_OPS, INPUT, Chain, _lit
from kerngen.agent.playbook.graph import trace, trace_module
from kerngen.agent.playbook.ops import UNARY_C
from kerngen.agent.playbook.pointwise import translate as translate_graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.harness.spec import plan
from kerngen.expr import TensorFacts
from kerngen.problems.load import load_problem

SHAPE = (64, 130)  # 130 % 4 != 0 and % 8 != 0: the tail path is rendered too


def translate(model: nn.Module, inputs: int = 1):
    """The elementwise chain of a module's forward over ``inputs`` meta tensors of SHAPE."""
    return translate_graph(trace_module(model, [torch.empty(*SHAPE, device="meta") for _ in range(inputs)]))


# ----- KernelBench-format files ---------------------------------------------------------------
def _source(forward: str, init: str = "", init_args: str = "", init_inputs: str = "", dtype: str = "float32",
            fwd_args: str = "x", inputs: str = "") -> str:
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    init_body = textwrap.indent(textwrap.dedent(init).strip(), " " * 8) if init.strip() else ""
    make = inputs or f"[torch.randn({SHAPE[0]}, {SHAPE[1]}, dtype=torch.{dtype}) * 3.0]"
    return (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        "class Model(nn.Module):\n"
        f"    def __init__(self{', ' + init_args if init_args else ''}):\n"
        "        super().__init__()\n"
        f"{init_body}\n\n"
        f"    def forward(self, {fwd_args}):\n"
        f"{body}\n\n\n"
        f"def get_inputs():\n    return {make}\n\n\n"
        f"def get_init_inputs():\n    return [{init_inputs}]\n"
    )


def _problem(tmp_path: Path, name: str, forward: str, **kw: Any):
    path = tmp_path / f"{name}.py"
    path.write_text(_source(forward, **kw))
    return load_problem(str(path))


# name -> (forward, keyword arguments of _source, ops the chain must contain)
CHAINS: dict[str, tuple[str, dict[str, str], set[str]]] = {
    "gelu_times_sigmoid": ("return F.gelu(x) * torch.sigmoid(x)", {}, {"gelu", "sigmoid", "mul"}),
    "gelu_tanh_times_sigmoid": ("return F.gelu(x, approximate='tanh') * x.sigmoid()", {}, {"gelu_tanh", "sigmoid", "mul"}),
    "rsub_div": ("return (2.0 - x) / 3 + 1 / (x * x + 1.0)", {}, {"sub", "div", "mul", "add"}),
    "square_scale": ("y = x * x\nreturn 0.5 * y + x.mul(2).add(1) - torch.square(x)", {}, {"mul", "square", "add", "sub"}),
    "leaky_clamp": ("return torch.clamp(F.leaky_relu(x, 0.2), min=-1.0, max=1.5).clamp_min(-0.5)", {},
                    {"leaky_relu", "clamp"}),
    "modules": ("return self.ht(self.act(x)) + self.lr(x) - self.r6(x) + self.sp(x) + self.idn(x)",
                dict(init="self.act = nn.GELU(approximate='tanh')\nself.ht = nn.Hardtanh(-2.0, 2.0)\n"
                          "self.lr = nn.LeakyReLU(0.05)\nself.r6 = nn.ReLU6()\nself.sp = nn.Softplus(beta=2.0, threshold=10.0)\n"
                          "self.idn = nn.Identity()"),
                {"gelu_tanh", "clamp", "leaky_relu", "softplus", "add", "sub"}),
    "sequential": ("return self.body(x) * 2", dict(init="self.body = nn.Sequential(nn.SiLU(), nn.Tanh(), nn.Mish())"),
                   {"silu", "tanh", "mish", "mul"}),
    "methods": ("return x.relu().mul(2).sub(x.abs()).clamp(min=0.1).pow(2) + x.neg().exp() + x.clamp_max(0.3)", {},
                {"relu", "mul", "sub", "abs", "clamp", "pow", "neg", "exp", "add"}),
    "where_compare": ("return torch.where(x > 0, x, 0.1 * x) + (x <= 1.0) * x + x.where(x != 0.5, 2.0)", {},
                      {"where", "gt", "le", "ne", "mul", "add"}),
    "max_min": ("return torch.maximum(x, torch.zeros_like(x)) - torch.minimum(x * 0.5, torch.tanh(x)) + torch.max(x, -x)", {},
                {"maximum", "minimum", "tanh", "mul", "sub", "neg", "add"}),
    "log_sqrt_pow": ("y = x.abs() + 1.0\nreturn torch.log(y) + torch.sqrt(y) + torch.rsqrt(y) + y ** 0.5 + y ** 1.7 + 2 ** x + y ** -1",
                     {}, {"abs", "log", "sqrt", "rsqrt", "pow", "add"}),
    "activations": ("return F.softplus(x) + F.elu(x, alpha=0.5) + F.mish(x) + F.hardswish(x) + F.hardsigmoid(x) + F.silu(x)"
                    " + F.selu(x) + F.logsigmoid(x) + F.softsign(x) + F.threshold(x, 0.1, -2.0) + F.relu6(x)",
                    {}, {"softplus", "elu", "mish", "hardswish", "hardsigmoid", "silu", "selu", "logsigmoid", "abs", "div",
                         "threshold", "clamp"}),
    "inplace_on_a_temporary": ("y = x * 2\ny = self.r(y)\nreturn F.relu(y + 1, inplace=True)", dict(init="self.r = nn.ReLU6(inplace=True)"),
                               {"mul", "clamp", "add", "relu"}),
    "init_input_slope": ("return F.leaky_relu(x, self.slope) * self.slope + torch.add(x, x, alpha=self.slope)",
                         dict(init="self.slope = slope", init_args="slope", init_inputs="0.3"), {"leaky_relu", "mul", "add"}),
    "bf16_chain": ("return torch.sigmoid(x) * x + 1", dict(dtype="bfloat16"), {"sigmoid", "mul", "add"}),
    "fp16_chain": ("return torch.tanh(x) - x / 2", dict(dtype="float16"), {"tanh", "div", "sub"}),
    "misc_unary": ("y = x.abs() + 0.5\nreturn torch.log1p(y) + torch.expm1(-y) + torch.reciprocal(y) + torch.sin(x) + torch.cos(x)"
                   " + torch.erf(x) + torch.floor(x) + torch.ceil(x) + torch.trunc(x) + torch.round(x) + x.clone().detach()",
                   {}, {"log1p", "expm1", "reciprocal", "sin", "cos", "erf", "floor", "ceil", "trunc", "round"}),
}


def _load(tmp_path: Path, name: str):
    forward, kw, _ = CHAINS[name]
    return _problem(tmp_path, name, forward, **kw)


# ----- a test-only evaluator: IR -> torch ops ---------------------------------------------------
def _t(a: Any) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.tensor(float(a))


TORCH: dict[str, Callable[..., Any]] = {
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"),
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu, "mish": F.mish, "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish, "selu": F.selu, "logsigmoid": F.logsigmoid,
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "square": torch.square, "reciprocal": torch.reciprocal,
    "sin": torch.sin, "cos": torch.cos, "erf": torch.erf, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "round": torch.round,
    "leaky_relu": F.leaky_relu, "elu": F.elu, "softplus": F.softplus, "threshold": F.threshold,
    "clamp": lambda a, lo, hi: torch.clamp(a, lo, hi),
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "pow": lambda a, b: torch.pow(a, b),
    "maximum": lambda a, b: torch.maximum(_t(a), _t(b)), "minimum": lambda a, b: torch.minimum(_t(a), _t(b)),
    "fmax": lambda a, b: torch.fmax(_t(a), _t(b)), "fmin": lambda a, b: torch.fmin(_t(a), _t(b)),
    "gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le, "eq": operator.eq, "ne": operator.ne,
    "where": torch.where,
}


def _evaluate(chain: Chain, x: torch.Tensor) -> torch.Tensor:
    env: dict[str, Any] = {INPUT: x}
    val = lambda a: env[a] if isinstance(a, str) else a  # noqa: E731
    for n in chain.nodes:
        env[n.var] = TORCH[n.op](*(val(a) for a in n.args), *n.params)
    out = val(chain.result)
    return out if isinstance(out, torch.Tensor) else torch.full_like(x, out)


def test_the_evaluator_knows_every_op():
    assert set(TORCH) == set(ALL_OPS)


# ----- recognition and translation ----------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CHAINS))
def test_recognised_as_an_elementwise_chain(tmp_path, name):
    p = _load(tmp_path, name)
    m = explain(p)
    assert m.family == "elementwise", why_not(p)
    f = m.facts
    chain: Chain = f.chain
    assert CHAINS[name][2] <= {n.op for n in chain.nodes}
    assert list(f.body) == chain.statements() and f.expr == chain.expr()
    assert f.op.isidentifier()
    for stmt in f.body:
        assert stmt.startswith(("float t", "bool t")) and stmt.endswith(";")


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_the_chain_computes_what_the_model_computes(tmp_path, name):
    p = _load(tmp_path, name)
    chain: Chain = explain(p).facts.chain
    model = p.build_model("cpu", 0).float()
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(*SHAPE, generator=g) * 3.0
        x[0, :4] = torch.tensor([0.0, -0.0, 0.5, 1.0])  # the edges of relu / where / clamp
        with torch.no_grad():
            want = model(x.clone())
        got = _evaluate(chain, x.clone())
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_formula_and_name(tmp_path):
    m = explain(_load(tmp_path, "gelu_times_sigmoid"))
    assert m.facts.formula == "gelu(x) * sigmoid(x)"
    assert m.facts.op == "gelu_sigmoid_mul"
    spec = family_of(m).build(m, "vec")
    assert spec.name == "playbook-elementwise-gelu_sigmoid_mul"
    assert "gelu(x) * sigmoid(x)" in spec.description
    assert "float t2 = t0 * t1;" in spec.source and "return t2;" in spec.source
    assert explain(_load(tmp_path, "rsub_div")).facts.formula.startswith("((2 - x) / 3)")


def test_c_text():
    assert _lit(2) == "2.0f" and _lit(0.1) == "0.100000001f" and _lit(-0.5) == "(-0.5f)" and _lit(1e-5) == "9.99999975e-06f"
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731
    assert f32(float(_lit(1 / 3)[:-1])) == f32(1 / 3)  # the literal reads back as the same fp32 value

    class M(nn.Module):
        def forward(self, x):
            return x ** 2 + x ** 0.5 + x ** -1 + x ** 1.5 + (x > 0) * x + torch.clamp(x, max=2.0)

    body = "\n".join(translate(M()).statements())
    assert "float t0 = v * v;" in body and "sqrtf(v)" in body and "1.f / v" in body and "powf(v, 1.5f)" in body
    assert re.search(r"bool (t\d+) = \(v > 0\.0f\);\n.*= \(\1 \? 1\.f : 0\.f\) \* v;", body)
    assert "kg_fmin(v, 2.0f)" in body


def test_dead_code_and_identity_are_dropped():
    class M(nn.Module):
        def forward(self, x):
            unused = torch.sigmoid(x)  # noqa: F841
            n = x.shape[0]  # noqa: F841
            return x.contiguous().detach() * 2

    chain = translate(M())
    assert [n.op for n in chain.nodes] == ["mul"] and chain.statements() == ["float t0 = v * 2.0f;"]


# ----- the single-op path stays as it was ----------------------------------------------------
def test_single_ops_are_their_formula_of_v(tmp_path):
    gelu = explain(load_problem("gelu"))
    assert (gelu.facts.op, gelu.facts.expr, gelu.facts.body) == ("gelu", UNARY_C["gelu"].format(a="v"), ())
    relu = explain(_problem(tmp_path, "relu", "return torch.relu(x)"))
    assert (relu.facts.op, relu.facts.expr) == ("relu", "(v < 0.f ? 0.f : v)")  # NaN stays NaN, as torch.relu
    mod = explain(_problem(tmp_path, "gelu_mod", "return self.g(x)", init="self.g = nn.GELU(approximate='tanh')"))
    assert (mod.facts.op, mod.facts.expr) == ("gelu_tanh", UNARY_C["gelu_tanh"].format(a="v"))
    spec = family_of(gelu).build(gelu, "vec")
    assert spec.name == "playbook-elementwise-gelu" and spec.description.startswith("gelu: ")
    assert f"return {UNARY_C['gelu'].format(a='v')};" in spec.source


def test_without_a_model_the_problem_is_refused_with_a_reason(tmp_path):
    p = _load(tmp_path, "gelu_times_sigmoid")
    bare = types.SimpleNamespace(info=p.info, source=p.source, name="bare")  # no build_model
    with pytest.raises(NotCovered, match="no model to build on the meta device"):
        explain(bare)


# ----- NotCovered ---------------------------------------------------------------------------------
# what the elementwise chain refuses (the partitioner may still cut the graph into regions a family serves)
REFUSED: dict[str, tuple[str, dict[str, str], str]] = {
    "reduction": ("return x * x.sum(dim=-1, keepdim=True)", {}, "reduction sum"),
    "reduction_max": ("return x - torch.max(x, dim=-1, keepdim=True)[0]", {}, "reduction max"),
    "parameter": ("return x * self.scale", dict(init=f"self.scale = nn.Parameter(torch.ones({SHAPE[1]}))"),
                  "parameter or buffer 'scale'"),
    "buffer": ("return x + self.b", dict(init=f"self.register_buffer('b', torch.ones({SHAPE[1]}))"), "parameter or buffer 'b'"),
    "module_with_parameters": ("return self.p(x)", dict(init="self.p = nn.PReLU()"), "prelu"),
    "two_inputs": ("return x * y", dict(fwd_args="x, y", inputs=f"[torch.randn{SHAPE}, torch.randn{SHAPE}]"), "one input"),
    "cast": ("return x.float() * 2", dict(dtype="bfloat16"), r"dtype cast \.to\(\)"),
    "cast_to": ("return (x * 2).to(torch.float16)", {}, r"dtype cast \.to\(\)"),
    "shape_op": ("return x.transpose(0, 1).transpose(0, 1) * 2", {}, "shape op transpose"),
    "unknown_op": ("return torch.atan(x) * 2", {}, "op atan is not covered"),
    "floor_division": ("return x // 2 + x", {}, "op floor_divide"),
    "boolean_logic": ("return ((x > 0) + (x < 1)) * x", {}, "two boolean values"),
    "dropout_training": ("return F.dropout(x, 0.5, training=True) * 2", {}, "dropout in training mode"),
    "flatten_module": ("return self.f(x) * 2", dict(init="self.f = nn.Flatten(0)"), "shape op flatten"),
    "unknown_module": ("return self.c(x) * 2", dict(init="self.c = nn.CELU()"), "op celu"),
}
# what no kernel covers at all: the problem is refused with the reason
NOTHING: dict[str, tuple[str, dict[str, str], str]] = {
    "inplace_on_the_input": ("y = x.relu_()\nreturn y + x", {}, "changes 'x' in place"),
    "inplace_through_a_view": ("y = x.detach()\ny.mul_(2)\nreturn x + 1", {}, "changes 'x' in place"),
    "control_flow": ("if x.sum() > 0:\n    return x * 2\nreturn x", {}, "cannot trace"),
    "unknown_op": ("return torch.atan(x) * 2", {}, "NotCovered: atan at atan"),
    "shape_op": ("return x.transpose(0, 1) * 2", {}, "NotCovered: transpose at transpose"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_chain_refuses_with_a_one_line_reason(tmp_path, name):
    forward, kw, word = REFUSED[name]
    p = _problem(tmp_path, name, forward, **kw)
    with pytest.raises(NotCovered, match=word) as exc:
        translate_graph(trace(p))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("name", sorted(NOTHING))
def test_not_covered_with_a_one_line_reason(tmp_path, name):
    forward, kw, word = NOTHING[name]
    p = _problem(tmp_path, name, forward, **kw)
    with pytest.raises(NotCovered, match=word) as exc:
        explain(p)
    assert "\n" not in str(exc.value)
    assert PlaybookProposer(p).match is None


def test_infinite_constants_are_their_bits():
    class M(nn.Module):
        def forward(self, x):
            return torch.clamp(x, min=float("-inf"), max=2.0) * 2

    assert "kg_fmax(v, __int_as_float(0xff800000))" in "\n".join(translate(M()).statements())


def test_a_second_input_is_refused_by_the_chain_itself():
    class M(nn.Module):
        def forward(self, x, y):
            return x * y

    with pytest.raises(NotCovered, match="second input 'y'"):
        translate(M(), inputs=2)


def test_returning_a_tuple_is_refused():
    class M(nn.Module):
        def forward(self, x):
            return x * 2, x

    with pytest.raises(NotCovered, match="one tensor"):
        translate(M())


# ----- rendering and NVRTC -------------------------------------------------------------------------
def _compile(spec, m) -> None:
    from kerngen.harness.compile.compiler import compile_job, job_for

    facts = {k: TensorFacts(tuple(v)) for k, v in m.tensors().items()}
    resolved = plan.resolve(spec, sizes={}, tensors=facts)
    compile_job(job_for(spec, resolved, "sm_90"), cache=None)


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_rendered_chain_compiles_for_every_dtype(tmp_path, name):
    m = explain(_load(tmp_path, name))
    for dtype in ("float32", "bfloat16", "float16"):
        m.inputs[0] = replace(m.inputs[0], dtype=dtype)
        spec = family_of(m).build(m, "vec")
        assert "{{" not in spec.source and "{%" not in spec.source
        for stmt in m.facts.body:
            assert stmt in spec.source
        _compile(spec, m)


def test_proposer_rounds_on_a_chain(tmp_path):
    prop = PlaybookProposer(_load(tmp_path, "where_compare"))
    assert prop.match is not None and prop.match.family == "elementwise"
    from kerngen.agent.proposer import SearchContext
    from kerngen.harness.results import GpuFacts

    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in prop.match.tensors().items()}, gpu=GpuFacts(name="H100"))
    ideas = prop.ideas(ctx, None, 2)
    assert ideas
    branches = prop.implement(ctx, None, ideas[0], 2)
    assert branches and all(b.spec is not None and b.spec.name.startswith("playbook-elementwise-") for b in branches)


# ----- GPU tier: the rendered kernels pass the harness's checks ---------------------------------------
GPU_CHAINS = ["gelu_times_sigmoid", "modules", "where_compare", "max_min", "log_sqrt_pow", "activations", "bf16_chain",
              "fp16_chain", "misc_unary"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_CHAINS)
def test_gpu_chain_kernels_pass_the_checks(tmp_path, name):
    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.problems.ref import ProblemRef

    p = _load(tmp_path, name)
    prop = PlaybookProposer(p)
    assert prop.match is not None, prop.reason
    cands = [Candidate(spec=b.spec) for e in prop._entries() for b in prop._render(e, None, 2) if b.spec is not None]
    assert cands
    with WorkerPool(timeout_s=120) as pool:
        results = pool.evaluate(ProblemRef(source=str(p.path)), cands, EvalOptions(seeds=2, budget_ms=20, timeout_s=120))
    bad = [f"{c.spec.name} {r.config}: {r.verdict.value} {r.message}" for c, r in zip(cands, results) if not r.ok]
    assert not bad, "\n".join(bad)
