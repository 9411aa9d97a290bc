"""The epilogue tracer: x -> one leading module -> an elementwise chain, as C statements over the
module's output element and the extra tensors the chain reads (per channel, scalar, full)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

from kerngen.agent.playbook.epilogue import EpIndex, EpParam, classify, trace_epilogue
from kerngen.agent.playbook.graph import trace_module
from kerngen.agent.playbook.not_covered import NotCovered


def _gemm(forward, **params):
    """A model ``gemm = Linear(8, 6)`` whose forward is ``forward(self, x)`` or ``forward(self, x, y)``."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.gemm = nn.Linear(8, 6)
            for k, v in params.items():
                setattr(self, k, nn.Parameter(v))

    class M1(M):
        def forward(self, x):
            return forward(self, x)

    class M2(M):
        def forward(self, x, y):
            return forward(self, x, y)

    return (M2 if forward.__code__.co_argcount == 3 else M1)().to("meta")


def _trace(model, shapes=None, lead="linear", channel_dim=-1):
    """The epilogue after the graph's ``lead`` node, the model traced on meta inputs of ``shapes``."""
    shapes = shapes or {"x": (4, 8)}
    g = trace_module(model, [torch.empty(s, device="meta") for s in shapes.values()], list(shapes))
    return trace_epilogue(g, next(n for n in g.nodes if n.op == lead), channel_dim=channel_dim)


def test_plain_chain_after_linear():
    ep = _trace(_gemm(lambda s, x: torch.nn.functional.leaky_relu(s.gemm(x) * 2.0, 0.1)))
    assert ep.lead == "gemm" and not ep.params and not ep.empty
    assert ep.statements[0] == "float t0 = v * 2.0f;"
    assert "t0 * 0.100000001f" in ep.statements[1] and ep.expr == "t1"
    assert ep.formula == "leaky_relu((x * 2), 0.1)" and ep.slug == "mul_leaky_relu"


def test_no_epilogue_is_empty():
    ep = _trace(_gemm(lambda s, x: s.gemm(x)))
    assert ep.empty and ep.expr == "v" and ep.statements == () and ep.slug == ""


def test_parameters_by_how_they_broadcast():
    ep = _trace(_gemm(lambda s, x: torch.relu(s.gemm(x) + s.bias) * s.scale - s.bias,
                      bias=torch.zeros(6), scale=torch.ones(1)))
    assert ep.params == (EpParam("bias", EpIndex.channel), EpParam("scale", EpIndex.scalar))
    body = " ".join(ep.statements)
    assert "v + ep0[ch]" in body and "* ep1[0]" in body and body.count("ep0[ch]") == 2
    assert "bias" in ep.formula and "scale" in ep.formula


def test_a_residual_input_is_read_at_the_output_offset():
    ep = _trace(_gemm(lambda s, x, y: s.gemm(x) * y + y), shapes={"x": (4, 8), "y": (4, 6)})
    assert ep.params == (EpParam("y", EpIndex.full),)
    assert "ep0[idx]" in " ".join(ep.statements)


def test_conv_bias_of_shape_c11_is_per_channel():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 5, 3)
            self.bias = nn.Parameter(torch.zeros(5, 1, 1))

        def forward(self, x):
            return torch.relu(self.conv(x)) + self.bias

    ep = _trace(M().to("meta"), shapes={"x": (2, 3, 9, 9)}, lead="conv2d", channel_dim=1)
    assert ep.params == (EpParam("bias", EpIndex.channel),) and ep.lead == "conv"


@pytest.mark.parametrize("forward, params, shapes, why", [
    (lambda s, x: s.gemm(x).sum(dim=1, keepdim=True), {}, None, "not the shape of the leading module"),
    (lambda s, x: torch.softmax(s.gemm(x), dim=1), {}, None, "softmax"),
    (lambda s, x: s.gemm(x) + x.sum(), {}, None, "input again"),
    (lambda s, x: s.gemm(x) * s.w, {"w": torch.ones(4, 1)}, None, "does not broadcast per channel"),
    (lambda s, x: s.gemm(x * 2.0), {}, None, "not applied directly to a forward input"),
    (lambda s, x, y: s.gemm(x) + y, {}, {"x": (4, 8), "y": (4, 1)}, r"input 'y' of shape \(4, 1\)"),
])
def test_what_is_not_an_elementwise_epilogue(forward, params, shapes, why):
    with pytest.raises(NotCovered, match=why):
        _trace(_gemm(forward, **params), shapes=shapes)


def test_a_buffer_is_read_per_channel_like_a_parameter():
    class B(nn.Module):
        def __init__(self):
            super().__init__()
            self.gemm = nn.Linear(8, 6)
            self.register_buffer("shift", torch.zeros(6))

        def forward(self, x):
            return self.gemm(x) + self.shift

    assert _trace(B().to("meta")).params == (EpParam("shift", EpIndex.channel),)


@pytest.mark.parametrize("shape, lead, ch, want", [
    ((6,), (4, 6), -1, EpIndex.channel), ((1, 6), (4, 6), -1, EpIndex.channel), ((4, 6), (4, 6), -1, EpIndex.full),
    ((), (4, 6), -1, EpIndex.scalar), ((1,), (4, 6), -1, EpIndex.scalar), ((5, 1, 1), (2, 5, 7, 7), 1, EpIndex.channel),
    ((1, 5, 1, 1), (2, 5, 7, 7), 1, EpIndex.channel), ((5,), (2, 5, 7, 7), 1, None), ((4, 1), (4, 6), -1, None),
    ((2, 6), (4, 6), -1, None), ((3, 4, 6), (4, 6), -1, None),
])
def test_classify(shape, lead, ch, want):
    assert classify(shape, lead, ch) is want


def test_an_eval_batch_norm_is_its_per_channel_affine_map_and_matches_pytorch():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.gemm = nn.Linear(8, 6)
            self.bn = nn.BatchNorm1d(6, eps=1e-3)

        def forward(self, x):
            return torch.relu(self.bn(self.gemm(x)))

    ep = _trace(M().eval().to("meta"))
    assert [p.name for p in ep.params] == ["bn.running_mean", "bn.running_var", "bn.weight", "bn.bias"]
    assert all(p.index is EpIndex.channel for p in ep.params)
    # the C statements, evaluated with torch on random statistics, give what the module gives
    torch.manual_seed(0)
    ref = M().eval()
    with torch.no_grad():
        ref.bn.running_mean.normal_()
        ref.bn.running_var.uniform_(0.5, 2.0)
        ref.bn.weight.normal_()
        ref.bn.bias.normal_()
        x = torch.randn(4, 8)
        v = ref.gemm(x)
        want = ref(x)
    env = {"v": v, "ep0": ref.bn.running_mean, "ep1": ref.bn.running_var, "ep2": ref.bn.weight, "ep3": ref.bn.bias,
           "rsqrtf": torch.rsqrt, "kg_fmax": torch.maximum, "kg_fmin": torch.minimum}
    for st in ep.statements:
        name, rhs = st.removeprefix("float ").rstrip(";").split(" = ", 1)
        rhs = re.sub(r"(\d\.?\d*(?:e-?\d+)?)f\b", r"\1", rhs.replace("[ch]", "").replace("0.f", "0.0"))
        rhs = re.sub(r"\((\w+) < 0\.0 \? 0\.0 : \1\)", r"torch.relu(\1)", rhs)  # relu's ternary
        env[name] = eval(rhs, {"torch": torch}, env)  # noqa: S307 - our own generated text
    got = env[ep.expr]
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_a_training_mode_batch_norm_is_not_an_epilogue():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.gemm = nn.Linear(8, 6)
            self.bn = nn.BatchNorm1d(6)

        def forward(self, x):
            return self.bn(self.gemm(x))

    with pytest.raises(NotCovered, match="num_batches_tracked.* in place"):  # it updates its statistics
        _trace(M().train().to("meta"))
