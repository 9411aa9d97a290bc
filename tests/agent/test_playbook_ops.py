"""The op table (agent/playbook/ops.py): every pointwise formula, as the one code generator writes it, run on the
CPU emulator over NaN, +-inf, +-0.0, denormals and ordinary values, against PyTorch's own op on the CPU; and the
classification of the ATen ops the front end meets."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kerngen.agent.playbook.chain_ir import INPUT, Chain, Node
from kerngen.agent.playbook.ops import BINARY_C, COMPARE_C, OPS, PARAM_C, UNARY_C, Kind, kind_of, why
from kerngen.agent.playbook.render import render
from kerngen.harness.spec.spec import KernelSpec
from tests.emu.runner import emulate

DENORMAL = 1e-40
VALUES = [math.nan, math.inf, -math.inf, -0.0, 0.0, DENORMAL, -DENORMAL, 1e-20, -1e-20, 0.5, -0.5, 1.0, -1.0, 2.5,
          -2.5, 3.0, -3.0, 6.5, -6.5, 20.5, 30.0, -30.0, 88.0, -88.0, 1e30, -1e30]
OTHER = [2.0, -1.5, math.nan, 0.0, -0.0, math.inf, 3.0, 1.0, -math.inf, 0.25, 2.0, -2.0, 1.0, 0.5, -3.0, 1e-30, 7.0,
         0.0, -0.5, 1.5, DENORMAL, 4.0, -1.0, 2.0, 1e-10, -7.5]

# op -> (IR params, the torch reference of (a, b))
UNARY = {
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"), "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "silu": F.silu, "mish": F.mish, "hardsigmoid": F.hardsigmoid, "hardswish": F.hardswish,
    "selu": F.selu, "logsigmoid": F.logsigmoid, "neg": torch.neg, "abs": torch.abs, "exp": torch.exp,
    "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "square": torch.square, "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf,
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round,
}
PARAM = {
    "leaky_relu": ((0.01,), lambda a: F.leaky_relu(a, 0.01)),
    "elu": ((0.7,), lambda a: F.elu(a, 0.7)),
    "softplus": ((1.5, 20.0), lambda a: F.softplus(a, 1.5, 20.0)),
    "threshold": ((0.5, -2.0), lambda a: F.threshold(a, 0.5, -2.0)),
    "clamp": ((-1.0, 2.0), lambda a: torch.clamp(a, -1.0, 2.0)),
}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
          "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
          **{k: getattr(torch, k) for k in COMPARE_C}}
EXPONENTS = (2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.7)  # the ones torch special-cases, and one it does not
# where torch's CPU kernels differ from its CUDA kernels (the formulas follow CUDA, where the reference runs):
# gelu's vectorised CPU erf gives NaN at +-inf (CUDA's erff gives +-1), so CUDA's gelu(+inf) is inf
CPU_ONLY = {("gelu", math.inf), ("gelu", -math.inf), ("gelu_tanh", -math.inf)}
# a zero's sign where torch's backends disagree among themselves (max/min/clamp/relu: std::max on the CPU,
# fmaxf on the GPU): the value is compared, not the sign
ANY_ZERO_SIGN = {"relu", "clamp", "maximum", "minimum", "fmax", "fmin", "hardsigmoid", "hardswish", "leaky_relu",
                 "elu", "selu", "threshold", "gelu", "gelu_tanh", "silu", "mish", "round"}


def _cases() -> list[tuple[str, Chain, object]]:
    out = []
    for op, ref in UNARY.items():
        out.append((op, Chain((Node("t0", op, (INPUT,)),), "t0"), lambda a, b, ref=ref: ref(a)))
    for op, (params, ref) in PARAM.items():
        out.append((op, Chain((Node("t0", op, (INPUT,), params),), "t0"), lambda a, b, ref=ref: ref(a)))
    out.append(("clamp", Chain((Node("t0", "clamp", (INPUT,), (0.0, None)),), "t0"),
                lambda a, b: torch.clamp(a, min=0.0)))
    for e in EXPONENTS:
        out.append(("pow", Chain((Node("t0", "pow", (INPUT, e)),), "t0"), lambda a, b, e=e: torch.pow(a, e)))
    for op, ref in BINARY.items():
        dtype = "bool" if op in COMPARE_C else "float"
        out.append((op, Chain((Node("t0", op, (INPUT, "w"), (), dtype),), "t0"),
                    lambda a, b, ref=ref: ref(a, b).float()))
    cond = Node("t0", "gt", (INPUT, 0.0), (), "bool")
    out.append(("where", Chain((cond, Node("t1", "where", ("t0", INPUT, "w"))), "t1"),
                lambda a, b: torch.where(a > 0.0, a, b)))
    return out


CASES = _cases()


def _spec() -> KernelSpec:
    blocks = []
    for k, (_, chain, _) in enumerate(CASES):
        body = " ".join(chain.statements())
        value = f"({chain.expr()} ? 1.f : 0.f)" if chain.nodes[-1].dtype == "bool" else chain.expr()
        blocks.append(f"  {{ {body} out[{k} * n + i] = {value}; }}")
    source = (render("_epilogue.cuh.j2") + "\nextern \"C\" __global__ void formulas(const float *a, const float *b, "
              "float *out, long long n) {\n  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
              "  if (i >= n) return;\n  const float v = a[i], w = b[i];\n" + "\n".join(blocks) + "\n}\n")
    return KernelSpec(name="formulas", source=source, steps=[dict(kernel="formulas", grid=["cdiv(a.numel, 32)"],
                                                                  block=[32], args=[{"name": "a"}, {"name": "b"},
                                                                                    {"name": "out"},
                                                                                    {"kind": "int64",
                                                                                     "value": "a.numel"}])])


@pytest.fixture(scope="module")
def computed() -> torch.Tensor:
    a, b = torch.tensor(VALUES, dtype=torch.float32), torch.tensor(OTHER, dtype=torch.float32)
    out = torch.full((len(CASES), len(VALUES)), math.nan)
    emulate(_spec(), {"a": a, "b": b, "out": out})
    return out


def _same(op: str, got: float, want: float, exact: float) -> str:
    """"" when ``got`` is torch's ``want`` (NaN as NaN, infinities and zeros exactly, with their sign unless the
    backends disagree on it; a finite value within a few ulps of torch's fp32 result or of the exact (fp64) one:
    the emulator runs the host's libm, not CUDA's, and torch's fp32 CPU kernels round on their own), else why not."""
    if math.isnan(want) or math.isnan(got):
        return "" if math.isnan(want) and math.isnan(got) else f"{got} != {want}"
    if math.isinf(want) or math.isinf(got):
        return "" if got == want else f"{got} != {want}"
    if want == 0.0 and got == 0.0:
        same_sign = math.copysign(1, got) == math.copysign(1, want)
        return "" if same_sign or op in ANY_ZERO_SIGN else f"{got} != {want} (sign of zero)"
    if any(abs(got - w) <= max(4e-6 * abs(w), 1e-44) for w in (want, exact)):
        return ""
    return f"{got} != {want} (exact {exact})"


@pytest.mark.needs_cxx
@pytest.mark.parametrize("k", range(len(CASES)), ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(CASES)])
def test_formula_is_torchs_on_special_values(computed, k):
    op, chain, ref = CASES[k]
    a, b = torch.tensor(VALUES, dtype=torch.float32), torch.tensor(OTHER, dtype=torch.float32)
    want, exact = ref(a, b), ref(a.double(), b.double())
    bad = []
    for i, x in enumerate(VALUES):
        if (op, x) in CPU_ONLY:
            continue
        why_not = _same(op, float(computed[k, i]), float(want[i]), float(exact[i]))
        if why_not:
            bad.append(f"{op}({x!r}, {OTHER[i]!r}): {why_not}")
    assert not bad, "; ".join(bad[:6])


@pytest.mark.needs_cxx
def test_the_relu_keeps_nan_as_torch_does(computed):
    k = next(i for i, (op, _, _) in enumerate(CASES) if op == "relu")
    assert math.isnan(float(computed[k, VALUES.index(math.nan)]))


def test_every_formula_is_tested_and_every_pointwise_op_has_one():
    tested = {op for op, _, _ in CASES}
    assert set(UNARY_C) | set(PARAM_C) | set(BINARY_C) | set(COMPARE_C) | {"where"} <= tested
    for name, op in OPS.items():
        if op.kind == Kind.pointwise and op.ir:
            assert op.ir in tested, name


@pytest.mark.parametrize("op, kind", [
    ("conv_transpose3d", Kind.conv), ("linear", Kind.contraction), ("group_norm", Kind.norm),
    ("logsumexp", Kind.reduction), ("cumsum", Kind.scan), ("softmax", Kind.softmax), ("max_pool3d", Kind.pool),
    ("scaled_dot_product_attention", Kind.attention), ("view", Kind.view), ("mse_loss", Kind.loss),
    ("hardtanh", Kind.pointwise), ("clone", Kind.identity), ("zeros_like", Kind.constant)])
def test_classification(op, kind):
    assert kind_of(op) is kind


def test_max_of_two_tensors_is_pointwise_and_reasons_name_the_kind():
    assert kind_of("max", "other") is Kind.pointwise and kind_of("max", "dim") is Kind.reduction
    assert why("sum", "the elementwise chain") == "reduction sum is not covered by the elementwise chain"
    assert why("permute", "x") == "shape op permute is not covered by x"
    assert why("to", "x") == "dtype cast .to() is not covered by x"
    assert why("atan", "x") == "op atan is not covered by x"
