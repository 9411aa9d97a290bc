"""Variant builders of the elementwise family: the 16-byte-vector chain and the broadcast map."""

from __future__ import annotations


from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import make_spec, pick, render, shape_prod, vec_width


# ---------------------------------------------------------------------------------------------
# elementwise
def elementwise_vec(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    if m.facts.operands:
        raise ValueError("the vector kernel reads one tensor of the output's shape; this map reads several")
    x = m.x
    ve = vec_width(x.dtype)
    op = m.facts.op  # a C-identifier fragment: "gelu", or a chain's ops ("gelu_sigmoid_mul")
    kernel = f"ew_{op}"
    body = list(m.facts.body)  # a fused chain's statements; the result is facts.expr
    src = render("elementwise.cu.j2", dtype=x.dtype, op=m.facts.expr, body=body, kernel=kernel)
    d = pick(defaults, dict(BLOCK=256, UNROLL=4, GRID_CAP=0, CACHE_HINT=0))
    nvec = f"({x.name}.numel // {ve})"
    grid = f"max(1, min(cdiv({nvec}, BLOCK * UNROLL), GRID_CAP) if GRID_CAP > 0 else cdiv({nvec}, BLOCK * UNROLL))"
    n_ops = f"{len(body)} op" + ("s" if len(body) != 1 else "")
    what = f"fused chain {m.facts.formula or op} ({n_ops} in fp32 registers)" if body else op
    return make_spec(
        f"playbook-elementwise-{op}",
        f"{what}: 16-byte vector loads ({ve} x {x.dtype}), UNROLL vectors per thread in flight, streaming cache hints",
        src,
        dict(BLOCK=[128, 256, 512, 1024], UNROLL=[1, 2, 4, 8], GRID_CAP=[0, 528, 1056, 2112, 4224], CACHE_HINT=[0, 1]),
        d,
        constraints=[f"{x.name}.numel < 2**62"],
        steps=[dict(kernel=kernel, grid=[grid], block=["BLOCK"],
                    args=[{"name": x.name}, {"name": "out"}, {"kind": "int64", "value": f"{x.name}.numel"}])],
    )


def elementwise_map(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """A pointwise map over several operands broadcast to the output (fp32): a thread an element."""
    f = m.facts
    if not f.operands:
        raise ValueError("a map of one tensor of the output's shape is the vector kernel's")
    out = m.outputs[0]
    rank = len(out.shape)
    kernel = f"map_{f.op}"
    dims, defines = [], {f"MAP_D{d}": f"out.shape[{d}]" for d in range(rank)}
    for i, (name, shape) in enumerate(f.operands):
        pad = rank - len(shape)
        varies = [d for d in range(rank) if d >= pad and shape[d - pad] != 1]
        dims.append(varies)
        for d in varies:
            defines[f"MAP_S{i}_{d}"] = shape_prod(name, range(d - pad + 1, len(shape)))
    src = render("map.cu.j2", kernel=kernel, rank=rank, operands=dims, body=list(f.body), expr=f.expr)
    d = pick(defaults, dict(BLOCK=256, GRID_CAP=0))
    grid = "max(1, min(cdiv(out.numel, BLOCK), GRID_CAP) if GRID_CAP > 0 else cdiv(out.numel, BLOCK))"
    return make_spec(
        f"playbook-elementwise-map-{f.op}",
        f"pointwise map {f.formula} over {len(f.operands)} broadcast operands: a thread an element, fp32 registers",
        src,
        dict(BLOCK=[128, 256, 512, 1024], GRID_CAP=[0, 1056, 4224]),
        d,
        defines=defines,
        constraints=["out.numel < 2**62", f"out.ndim == {rank}"],
        steps=[dict(kernel=kernel, grid=[grid], block=["BLOCK"],
                    args=[{"name": name} for name, _ in f.operands] + [{"name": "out"},
                                                                        {"kind": "int64", "value": "out.numel"}])],
    )
