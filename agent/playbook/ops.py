"""The one op table of the playbook: every ATen op its front end (:mod:`.graph`) may meet, classified, and for
the pointwise ones the C formula every kernel uses.

``OPS[aten name]`` is an :class:`Op`: its :class:`Kind` (what a region can do with it) and, for a pointwise op,
the IR op it translates to (:mod:`.pointwise`). The formulas (``FORMULAS``, by IR op) are fp32 C over
operands ``{a}`` ``{b}`` and constant parameters ``{p0}`` ``{p1}``, written as PyTorch's CUDA kernels compute
them, so that NaN, infinities, signed zeros and denormals come out as torch's do (no fast math: denormals are
kept). Where torch's own CPU and CUDA kernels differ, the formula follows CUDA (the harness's reference runs
there); :mod:`tests.agent.test_playbook_ops` checks every formula against torch on NaN, +-inf, +-0.0 and
denormals and names the CPU/CUDA differences it allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["BINARY_C", "COMPARE_C", "FORMULAS", "Kind", "OPS", "Op", "PARAM_C", "UNARY_C", "dim_text", "kind_of", "why"]


class Kind(str, Enum):
    pointwise = "pointwise"  # one value per element from the same position of its operands (broadcast)
    identity = "identity"  # the operand itself (clone, contiguous, eval-mode dropout)
    constant = "constant"  # a constant of an operand's shape (zeros_like, ...)
    view = "view"  # the same elements in another shape or order (no arithmetic)
    reduction = "reduction"  # over some dims
    scan = "scan"  # cumulative along a dim
    softmax = "softmax"  # softmax / log_softmax along a dim (a row stage)
    contraction = "contraction"  # a matrix product
    conv = "conv"
    pool = "pool"
    norm = "norm"  # a normalisation: statistics, then a pointwise map
    loss = "loss"  # a loss function (a reduction of pointwise terms, or of per-row losses)
    attention = "attention"
    rnn = "rnn"  # a recurrent layer (nn.LSTM): a GEMM over all steps, then a sequential recurrence
    data = "data"  # other data movement (cat, flip, triu, ...)


@dataclass(frozen=True)
class Op:
    kind: Kind
    ir: str = ""  # a pointwise op's IR op (a key of FORMULAS), "" where the translator decides


# ----------------------------------------------------------------------------------------------
# formulas of the IR ops (fp32). {a} {b}: operands; {p0} {p1}: constant parameters.
UNARY_C: dict[str, str] = {
    "relu": "({a} < 0.f ? 0.f : {a})",  # NaN stays NaN, as torch.relu
    "gelu": "0.5f * {a} * (1.f + erff({a} * 0.70710678118654752f))",
    "gelu_tanh": "0.5f * {a} * (1.f + tanhf(0.79788456080286536f * ({a} + 0.044715f * {a} * {a} * {a})))",
    "sigmoid": "1.f / (1.f + expf(-{a}))",
    "tanh": "tanhf({a})",
    "silu": "{a} / (1.f + expf(-{a}))",
    "mish": "{a} * tanhf(log1pf(expf({a})))",
    "hardsigmoid": "kg_fmin(kg_fmax({a} + 3.f, 0.f), 6.f) * (1.f / 6.f)",
    "hardswish": "{a} * kg_fmin(kg_fmax({a} + 3.f, 0.f), 6.f) * (1.f / 6.f)",
    "selu": "1.05070098735548049f * ({a} > 0.f ? {a} : 1.67326324235437728f * expm1f({a}))",
    "logsigmoid": "fminf({a}, 0.f) - log1pf(expf(-fabsf({a})))",
    "neg": "-{a}",
    "abs": "fabsf({a})",
    "exp": "expf({a})",
    "expm1": "expm1f({a})",
    "log": "logf({a})",
    "log1p": "log1pf({a})",
    "sqrt": "sqrtf({a})",
    "rsqrt": "rsqrtf({a})",
    "square": "{a} * {a}",
    "reciprocal": "1.f / {a}",
    "sin": "sinf({a})",
    "cos": "cosf({a})",
    "erf": "erff({a})",
    "floor": "floorf({a})",
    "ceil": "ceilf({a})",
    "trunc": "truncf({a})",
    "round": "rintf({a})",  # half to even, as torch.round
}
PARAM_C: dict[str, str] = {  # unary ops with constant parameters
    "leaky_relu": "({a} > 0.f ? {a} : {a} * {p0})",
    "elu": "({a} > 0.f ? {a} : {p0} * expm1f({a}))",
    "softplus": "({a} * {p0} > {p1} ? {a} : log1pf(expf({a} * {p0})) / {p0})",
    "threshold": "({a} <= {p0} ? {p1} : {a})",
    "clamp": "",  # p0 / p1 may be absent: built by the code generator (kg_fmax / kg_fmin, NaN kept)
}
BINARY_C: dict[str, str] = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "pow": "",  # the exponents torch special-cases are written as it computes them: the code generator
    "maximum": "kg_fmax({a}, {b})",  # NaN from either side, as torch.maximum
    "minimum": "kg_fmin({a}, {b})",
    "fmax": "fmaxf({a}, {b})",  # NaN only when both are
    "fmin": "fminf({a}, {b})",
}
COMPARE_C: dict[str, str] = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}
FORMULAS: dict[str, str] = {**UNARY_C, **PARAM_C, **BINARY_C, **{k: f"{{a}} {v} {{b}}" for k, v in COMPARE_C.items()},
                            "where": "{c} ? {a} : {b}"}


_CASTS = ("_to_copy", "to", "type_as")


# ----------------------------------------------------------------------------------------------
# the ATen ops (op packet names, as :class:`~.graph.Node.op` has them)
def _table() -> dict[str, Op]:
    t: dict[str, Op] = {}
    P = Kind.pointwise
    for name in UNARY_C:
        t[name] = Op(P, name)
    t.update(negative=Op(P, "neg"), log_sigmoid=Op(P, "logsigmoid"), special_expit=Op(P, "sigmoid"),
             gelu=Op(P), leaky_relu=Op(P, "leaky_relu"), elu=Op(P, "elu"), softplus=Op(P, "softplus"),
             threshold=Op(P, "threshold"), hardtanh=Op(P, "clamp"), relu6=Op(P, "clamp"), clamp=Op(P, "clamp"),
             clamp_min=Op(P, "clamp"), clamp_max=Op(P, "clamp"), clip=Op(P, "clamp"),
             add=Op(P, "add"), sub=Op(P, "sub"), subtract=Op(P, "sub"), rsub=Op(P, "sub"), mul=Op(P, "mul"),
             multiply=Op(P, "mul"), div=Op(P, "div"), divide=Op(P, "div"), true_divide=Op(P, "div"),
             pow=Op(P, "pow"), maximum=Op(P, "maximum"), minimum=Op(P, "minimum"), fmax=Op(P, "fmax"),
             fmin=Op(P, "fmin"), where=Op(P, "where"), masked_fill=Op(P, "where"))
    t.update({k: Op(P, k) for k in COMPARE_C})
    t.update({k: Op(Kind.identity) for k in ("clone", "contiguous", "dropout", "alias", "detach", "lift_fresh_copy",
                                              "positive")})
    t.update({k: Op(Kind.constant) for k in ("zeros_like", "ones_like", "full_like")})
    t.update({k: Op(Kind.view) for k in ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten",
                                          "unflatten", "expand", "expand_as", "permute", "transpose", "t", "numpy_T",
                                          "mT", "movedim", "select", "narrow", "slice", "view_as", "broadcast_tensors",
                                          "getitem")})
    t.update({k: Op(Kind.identity) for k in _CASTS})  # of the same dtype; another is refused by the translator
    t.update({k: Op(Kind.reduction) for k in ("sum", "mean", "prod", "amax", "amin", "max", "min", "argmax",
                                               "argmin", "logsumexp", "linalg_vector_norm", "norm", "var", "std",
                                               "var_mean", "std_mean", "all", "any", "median", "mode")})
    t.update({k: Op(Kind.scan) for k in ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")})
    t.update({k: Op(Kind.softmax) for k in ("softmax", "log_softmax", "_softmax", "_log_softmax")})
    t.update({k: Op(Kind.contraction) for k in ("linear", "matmul", "mm", "bmm", "addmm", "einsum", "baddbmm",
                                                 "bilinear")})
    t.update({k: Op(Kind.conv) for k in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                                          "conv_transpose3d", "convolution")})
    t.update({k: Op(Kind.pool) for k in (*(f"{m}_pool{n}d" for m in ("max", "avg") for n in (1, 2, 3)),
                                          *(f"adaptive_{m}_pool{n}d" for m in ("max", "avg") for n in (1, 2, 3)),
                                          *(f"max_pool{n}d_with_indices" for n in (1, 2, 3)))})
    t.update({k: Op(Kind.norm) for k in ("batch_norm", "group_norm", "layer_norm", "instance_norm", "rms_norm")})
    t.update({k: Op(Kind.loss) for k in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
                                          "binary_cross_entropy", "binary_cross_entropy_with_logits",
                                          "soft_margin_loss", "cross_entropy_loss", "triplet_margin_loss", "nll_loss")})
    t["scaled_dot_product_attention"] = Op(Kind.attention)
    t["lstm"] = Op(Kind.rnn)
    t.update({k: Op(Kind.data) for k in ("cat", "stack", "flip", "roll", "triu", "tril", "diag", "gather",
                                          "index_select", "pad", "repeat")})
    return t


OPS: dict[str, Op] = _table()


def kind_of(op: str, overload: str = "") -> Kind | None:
    """The op's kind; ``max``/``min`` of two tensors (overload ``other``) are pointwise."""
    if op in ("max", "min") and overload == "other":
        return Kind.pointwise
    o = OPS.get(op)
    return o.kind if o is not None else None


_WHAT = {Kind.reduction: "reduction", Kind.scan: "scan", Kind.softmax: "reduction", Kind.view: "shape op",
         Kind.data: "shape op", Kind.contraction: "matrix product", Kind.conv: "convolution", Kind.pool: "pooling",
         Kind.norm: "normalisation", Kind.loss: "loss", Kind.attention: "attention", Kind.rnn: "recurrent layer"}
def why(op: str, where: str) -> str:
    """Why ``op`` is not covered by ``where`` (e.g. "the elementwise chain"), one line."""
    if op in _CASTS:
        return f"dtype cast .{op}() is not covered by {where}"
    what = _WHAT.get(kind_of(op))  # type: ignore[arg-type]
    return f"{what} {op} is not covered by {where}" if what else f"op {op} is not covered by {where}"


def dim_text(dim: object) -> object:
    """A reduction's ``dim`` argument for a message: a one-element list as its element."""
    return dim[0] if isinstance(dim, (list, tuple)) and len(dim) == 1 else dim
