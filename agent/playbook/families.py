"""Which op family a problem belongs to, read from its reference (info + forward source + modules).

``recognise_family(problem)`` returns a :class:`FamilyMatch` (the family and the facts its
templates need: input names, dtypes, eps, conv geometry, ...) or ``None``; ``explain(problem)``
returns the same match or a one-line reason why the playbook has nothing for the problem.
Works on a :class:`kerngen.problems.problem.Problem` (from the one loader,
:func:`kerngen.problems.load.load_problem`) and on anything shaped like one: ``.info`` (its
description: ``inputs``/``params``/``outputs`` of ``TensorInfo(name, shape, dtype)``, computed on
meta tensors), ``.source()``, optionally ``.build_model(device, seed)``. The model is only ever
built on the meta device (module attributes such as conv geometry and eps, and the forward for
torch.fx, need no weights): recognising a problem allocates nothing, whatever its size.
"""

from __future__ import annotations

import re
from typing import Any

from kerngen.agent.playbook.chain import translate  # torch.fx is imported inside, only for chains
from kerngen.agent.playbook.forward_source import UNKNOWN, Forward, dotted, kwarg, module_of
from kerngen.agent.playbook.match import FLOAT_DTYPES, FamilyMatch, Read, Tensor, pair, param_for, read_problem
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.registry import REGISTRY

BUILT_IN = ("elementwise", "softmax", "layernorm", "rmsnorm", "conv2d", "conv_relu_maxpool", "matmul")
FAMILIES = BUILT_IN + tuple(f.name for f in REGISTRY)

# unary elementwise ops: name -> C expression of float v
ELEMENTWISE_OPS: dict[str, str] = {
    "relu": "(v > 0.f ? v : 0.f)",
    "gelu": "0.5f * v * (1.f + erff(v * 0.70710678118654752f))",
    "gelu_tanh": "0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))",
    "sigmoid": "1.f / (1.f + expf(-v))",
    "tanh": "tanhf(v)",
    "silu": "v / (1.f + expf(-v))",
    "neg": "-v",
    "abs": "fabsf(v)",
    "exp": "expf(v)",
}
_ELEMENTWISE_ALIASES = {
    "relu": "relu", "relu_": "relu", "ReLU": "relu",
    "gelu": "gelu", "GELU": "gelu",
    "sigmoid": "sigmoid", "Sigmoid": "sigmoid",
    "tanh": "tanh", "Tanh": "tanh",
    "silu": "silu", "SiLU": "silu",
    "neg": "neg", "abs": "abs", "exp": "exp",
}


def explain(problem: Any) -> FamilyMatch:
    """The match, or raise :class:`NotCovered` with a one-line reason."""
    r = read_problem(problem)
    for fam in REGISTRY:  # the families of the registry first: each claims only its own problems
        m = fam.recognise(r)
        if m is not None:
            m.family = fam.name
            return m
    for d in sorted(r.dtypes):
        if d not in FLOAT_DTYPES:
            raise NotCovered(f"dtype {d} is not covered by the playbook")
    for recognise in (_matmul, _convolution):
        m = recognise(r)
        if m is not None:
            return m
    return _one_input_family(r)


def _matmul(r: Read) -> FamilyMatch | None:
    names, inputs, out = r.names, r.match.inputs, r.out
    if not (any(n in ("matmul", "mm") for n in names) or "MatMult" in r.fwd.binops):
        return None
    others = [n for n in names if n not in ("matmul", "mm")]
    transposed = re.search(r"\.(T|mT|t\(\)|transpose|permute)\b", r.fwd.text) is not None
    if others or len(inputs) != 2 or any(len(t.shape) != 2 for t in inputs) or transposed:
        raise NotCovered("the playbook covers plain 2-D A @ B only (no transposes, batches or epilogues)")
    a, b = inputs
    if a.shape[1] != b.shape[0] or out.shape != (a.shape[0], b.shape[1]):
        raise NotCovered("matmul operands do not match A (M, K) @ B (K, N)")
    if r.dtypes != {"float32"}:
        raise NotCovered("the playbook's matmul is fp32 only")
    r.match.family = "matmul"
    return r.match


def _convolution(r: Read) -> FamilyMatch | None:
    conv_calls = [(k, c, n) for k, c, n in r.kinds if k == "Conv2d"]
    if not conv_calls and "conv2d" not in r.names:
        return None
    if len(conv_calls) != 1 or len(r.match.inputs) != 1:
        raise NotCovered("the playbook covers one nn.Conv2d module applied to one input")
    _, callee, _ = conv_calls[0]
    mod = module_of(r.model, callee)
    if mod is None:
        raise NotCovered("cannot read the nn.Conv2d module's geometry (model did not build on the meta device)")
    prefix = callee.split(".", 1)[1]
    geo = _conv_geometry(mod)
    x = r.match.inputs[0]
    if len(x.shape) != 4 or r.dtypes != {"float32"}:
        raise NotCovered("the playbook's conv2d is NCHW fp32 only")
    weight = param_for(r.match.params, prefix, "weight")
    bias = param_for(r.match.params, prefix, "bias")
    if weight is None:
        raise NotCovered(f"no parameter {prefix}.weight among the model's parameters")
    facts = dict(geo, weight=weight.name, bias=bias.name if bias else None)
    rest = [k for k in r.names if k != "Conv2d"]
    relu = [k for k in rest if k in ("relu", "relu_", "ReLU")]
    pools = [(k, c, n) for k, c, n in r.kinds if k in ("MaxPool2d", "max_pool2d")]
    other = [k for k in rest if k not in ("relu", "relu_", "ReLU", "MaxPool2d", "max_pool2d")]
    if other:
        raise NotCovered(f"conv2d followed by {other[0]}: not covered by the playbook")
    if not relu and not pools:
        if r.out.shape[1:] != (geo["OC"], *_conv_out(x.shape, geo)):
            raise NotCovered("conv2d output shape does not match the module's geometry")
        r.match.family, r.match.facts = "conv2d", facts
        return r.match
    if len(relu) == 1 and len(pools) == 1:
        pk, ps = _pool_geometry(r.model, pools[0])
        oh, ow = _conv_out(x.shape, geo)
        if r.out.shape != (x.shape[0], geo["OC"], (oh - pk) // ps + 1, (ow - pk) // ps + 1):
            raise NotCovered("conv+relu+maxpool output shape does not match the modules' geometry")
        facts.update(PK=pk, PS=ps)
        r.match.family, r.match.facts = "conv_relu_maxpool", facts
        return r.match
    raise NotCovered("the playbook fuses conv2d + one relu + one max-pool only")


def _one_input_family(r: Read) -> FamilyMatch:
    """softmax, layernorm, rmsnorm, else elementwise (single op or fused chain)."""
    if len(r.match.inputs) != 1:
        raise NotCovered("the playbook's row and elementwise families take one input")
    x = r.match.inputs[0]
    for recognise in (_softmax, _layernorm):
        m = recognise(r, x)
        if m is not None:
            return m
    names = r.names
    if any(k in ("RMSNorm", "rms_norm") for k in names) or ({"rsqrt", "sqrt"} & set(names) and "mean" in names):
        return _rmsnorm(r, x)
    return _elementwise(r, x)


def _softmax(r: Read, x: Tensor) -> FamilyMatch | None:
    sm = [(k, c, n) for k, c, n in r.kinds if k in ("softmax", "Softmax", "log_softmax", "LogSoftmax")]
    if not sm:
        return None
    kind, callee, node = sm[0]
    if len(r.kinds) != 1 or r.fwd.binops:
        raise NotCovered(f"{kind} with other ops around it is not covered by the playbook")
    mod = module_of(r.model, callee)
    dim = getattr(mod, "dim", None) if mod is not None else kwarg(node, "dim", 1 if callee.startswith(("torch.", "F.", "nn.")) else 0,
                                                                    model=r.model)
    if dim is None or dim is UNKNOWN:
        raise NotCovered("cannot read softmax's dim from the source")
    if dim not in (-1, len(x.shape) - 1):
        raise NotCovered(f"{kind} over dim {dim} (not the last) is not covered by the playbook")
    if r.out.shape != x.shape or x.dtype != r.out.dtype:
        raise NotCovered("softmax output differs from its input in shape or dtype")
    r.match.family = "softmax"
    r.match.facts = dict(log=kind in ("log_softmax", "LogSoftmax"))
    return r.match


def _layernorm(r: Read, x: Tensor) -> FamilyMatch | None:
    ln = [(k, c, n) for k, c, n in r.kinds if k in ("LayerNorm", "layer_norm")]
    if not ln:
        return None
    if len(r.kinds) != 1 or r.fwd.binops:
        raise NotCovered("layernorm with other ops around it is not covered by the playbook")
    _, callee, _ = ln[0]
    mod = module_of(r.model, callee)
    if mod is None:
        raise NotCovered("the playbook reads layernorm from an nn.LayerNorm module only")
    shape = tuple(mod.normalized_shape)
    if tuple(x.shape[len(x.shape) - len(shape):]) != shape:
        raise NotCovered("layernorm's normalized_shape is not the input's trailing dims")
    prefix = callee.split(".", 1)[1]
    w = param_for(r.match.params, prefix, "weight")
    b = param_for(r.match.params, prefix, "bias")
    r.match.family = "layernorm"
    r.match.facts = dict(ndims=len(shape), eps=float(mod.eps), weight=w.name if w else None, bias=b.name if b else None,
                         wdtype=(w or b).dtype if (w or b) else x.dtype)
    return _check_wdtype(r.match, x)


def _single_op(kinds: list, fwd: Forward, model: Any) -> str | None:
    """The one unary op (a key of ELEMENTWISE_OPS) of a forward that is just ``op(x)``, read from
    the source, or None (then the forward may still be a fused chain)."""
    if len(kinds) != 1 or fwd.binops:
        return None
    k, callee, node = kinds[0]
    canon = _ELEMENTWISE_ALIASES.get(k)
    if canon == "gelu":
        mod = module_of(model, callee)
        approx = getattr(mod, "approximate", None) if mod is not None else kwarg(node, "approximate")
        if approx is UNKNOWN:
            return None  # the traced chain reads approximate= from the call itself
        canon = "gelu_tanh" if approx == "tanh" else "gelu"
    return canon


def _elementwise(r: Read, x: Tensor) -> FamilyMatch:
    """One unary op (facts ``op``, ``expr``) or a fused chain of elementwise ops over ``x`` (facts
    ``op``: a slug of the ops, ``expr``: the result, ``body``: C statements, ``formula``, ``chain``)."""
    match, kinds, fwd, model = r.match, r.kinds, r.fwd, r.model
    out = match.outputs[0]
    single = _single_op(kinds, fwd, model)
    if single is not None:
        facts: dict[str, Any] = dict(op=single, expr=ELEMENTWISE_OPS[single])
    elif model is None:  # no model to trace: say what the source shows
        unknown = next((k for k, _, _ in kinds if k not in _ELEMENTWISE_ALIASES), None)
        if unknown is not None:
            raise NotCovered(f"op {unknown!r} is not covered by the playbook")
        raise NotCovered("a chain of elementwise ops needs the model built on the meta device (to trace its forward)")
    else:
        facts = translate(model).facts()
    if out.shape != x.shape or out.dtype != x.dtype:
        raise NotCovered("elementwise output differs from its input in shape or dtype")
    match.family = "elementwise"
    match.facts = facts
    return match


def _check_wdtype(match: FamilyMatch, x: Tensor) -> FamilyMatch:
    wd = match.facts.get("wdtype")
    if wd not in ("float32", x.dtype):
        raise NotCovered(f"normalization weights in {wd} with {x.dtype} input are not covered")
    for t in match.params:
        if t.name in (match.facts.get("weight"), match.facts.get("bias")) and t.dtype != wd:
            raise NotCovered("normalization weight and bias differ in dtype")
    return match


def _rmsnorm(r: Read, x: Tensor) -> FamilyMatch:
    match, kinds, model, params, source = r.match, r.kinds, r.model, r.match.params, r.source
    last = len(x.shape) - 1
    eps: float | None = None
    weight: Tensor | None = None
    mods = [(k, c, n) for k, c, n in kinds if k == "RMSNorm"]
    if mods:
        k, callee, node = mods[0]
        mod = module_of(model, callee)
        if mod is None:
            raise NotCovered("cannot read the nn.RMSNorm module (model did not build on the meta device)")
        if tuple(mod.normalized_shape) != (x.shape[-1],):
            raise NotCovered("rmsnorm over more than the last dim is not covered by the playbook")
        eps = mod.eps
        if eps is None:
            import torch

            eps = float(torch.finfo(getattr(torch, x.dtype)).eps)
        weight = param_for(params, callee.split(".", 1)[1], "weight")
    else:
        # a hand-written x * rsqrt(mean(x^2, dim=-1) + eps) [* weight]
        means = [n for k, c, n in kinds if k == "mean"]
        for node in means:
            dim = kwarg(node, "dim", 0 if not dotted(node.func).startswith("torch.") else 1)
            if isinstance(dim, (tuple, list)) and len(dim) == 1:
                dim = dim[0]
            if dim not in (-1, last):
                raise NotCovered(f"rmsnorm over dim {dim} (not the last) is not covered by the playbook")
        eps_v = getattr(model, "eps", None) if model is not None else None
        if eps_v is None:
            m = re.search(r"eps\s*[:=]\s*(?:float\s*=\s*)?([0-9.eE+-]+)", source)
            eps_v = float(m.group(1)) if m else None
        if eps_v is None:
            raise NotCovered("cannot read rmsnorm's eps from the source")
        eps = float(eps_v)
        ws = [p for p in params if p.shape == (x.shape[-1],)]
        if len(params) > 1 or (params and not ws):
            raise NotCovered("rmsnorm with parameters other than one weight vector is not covered")
        weight = ws[0] if ws else None
    if match.outputs[0].shape != x.shape:
        raise NotCovered("rmsnorm output differs from its input in shape")
    match.family = "rmsnorm"
    match.facts = dict(ndims=1, eps=float(eps), weight=weight.name if weight else None, bias=None,
                       wdtype=weight.dtype if weight else x.dtype)
    return _check_wdtype(match, x)


def _conv_geometry(mod: Any) -> dict[str, int]:
    if getattr(mod, "groups", 1) != 1 or pair(getattr(mod, "dilation", 1)) != (1, 1):
        raise NotCovered("grouped or dilated conv2d is not covered by the playbook")
    if getattr(mod, "padding_mode", "zeros") != "zeros" or isinstance(mod.padding, str):
        raise NotCovered("conv2d with non-zero or string padding is not covered by the playbook")
    kh, kw = pair(mod.kernel_size)
    sh, sw = pair(mod.stride)
    ph, pw = pair(mod.padding)
    return dict(C=int(mod.in_channels), OC=int(mod.out_channels), KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw)


def _conv_out(shape: tuple[int, ...], g: dict[str, int]) -> tuple[int, int]:
    return (shape[2] + 2 * g["PH"] - g["KH"]) // g["SH"] + 1, (shape[3] + 2 * g["PW"] - g["KW"]) // g["SW"] + 1


def _pool_geometry(model: Any, pool: tuple) -> tuple[int, int]:
    k, callee, node = pool
    mod = module_of(model, callee)
    if mod is not None:
        ks, st, pad = mod.kernel_size, mod.stride, mod.padding
        dil, ceil = getattr(mod, "dilation", 1), getattr(mod, "ceil_mode", False)
    else:
        ks, st = kwarg(node, "kernel_size", 1), kwarg(node, "stride", 2)
        pad, dil, ceil = kwarg(node, "padding", 3) or 0, kwarg(node, "dilation", 4) or 1, kwarg(node, "ceil_mode", 5) or False
        if st is None:
            st = ks
    if any(v is UNKNOWN for v in (ks, st, pad, dil, ceil)) or ks is None:
        raise NotCovered("cannot read the max-pool's geometry from the source")
    ks, st = pair(ks), pair(st if st is not None else ks)
    if ks[0] != ks[1] or st[0] != st[1] or pair(pad) != (0, 0) or pair(dil) != (1, 1) or ceil:
        raise NotCovered("the playbook fuses square, unpadded, floor-mode max-pools only")
    return ks[0], st[0]


def recognise_family(problem: Any) -> FamilyMatch | None:
    """The playbook family of ``problem``, or None (``explain`` says why)."""
    try:
        return explain(problem)
    except NotCovered:
        return None


def why_not(problem: Any) -> str:
    """One line: the family found, or why the playbook has nothing for the problem."""
    try:
        m = explain(problem)
    except NotCovered as exc:
        return str(exc)
    return f"playbook family {m.family}"


__all__ = ["BUILT_IN", "FAMILIES", "FamilyMatch", "Tensor", "explain", "recognise_family", "why_not"]
