"""Variant builders of the ``lstm`` family (:mod:`.family` says what and why): per layer the ``gemm`` family's kernel
for the input projection (a ``linear`` + ``add`` graph made here, built at a configuration admissible at its
shapes), then the recurrence (``lstm_layer.cu.j2``, or ``lstm_splitk.cu.j2`` for ``splitk``), the layers joined
into one spec by :func:`~kerngen.agent.playbook.regions_spec.join`.

The recurrence's tunables are the family's own, shared by every layer (the layers have the same B and H): the
per-layer sub-specs name them without declaring them, so the join leaves them as they are and the joined spec
declares them once. ``lstm_layer``: JB hidden units per block, BR batch rows per thread, KC columns of h per staged
chunk; ``lstm_splitk``: :data:`.splitk.SK_TUNABLES`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from kerngen.harness.spec.spec import MAX_STEPS, KernelSpec, Launch, ScalarArg, Scratch, TensorArg
from kerngen.harness.tune.admissible import admissible, limits_for

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.gemm.gemm import GEMM
from kerngen.agent.playbook.graph import Graph, Node, Ref, Tensor, aten_node
from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.region import Region
from kerngen.agent.playbook.regions_spec import join
from kerngen.agent.playbook.render import MAX_SMEM, COOP_NB, render
from kerngen.agent.playbook.rnn.splitk import SK_TUNABLES, splitk_exprs

__all__ = ["lstm_persistent", "lstm_persistent_ffma", "lstm_splitk", "lstm_step"]

GATES, YBUF = "kg_lstm_gates", "kg_lstm_y"  # scratch: one layer's projection (reused), the inner layers' outputs
TUNABLES = {"JB": [1, 2, 4, 8, 16, 32], "BR": [1, 2, 4, 8], "KC": [16, 32, 64, 128]}


class Rec(str, Enum):
    """How a layer's recurrence runs."""

    persistent = "persistent"  # lstm_layer, one cooperative launch
    step = "step"  # lstm_layer, a launch per step
    splitk = "splitk"  # lstm_splitk, one cooperative launch


def _defaults(batch: int, hidden: int) -> dict[str, int]:
    jb = next((v for v in TUNABLES["JB"] if -(-hidden // v) <= COOP_NB), TUNABLES["JB"][-1])
    br = 2 if batch >= 64 else 1  # a warp of batch rows shares its unit's W_hh reads (broadcast)
    hp = -(-hidden // 4) * 4
    kc = next((v for v in (64, 32, 16) if v <= hp), 16)
    return {"JB": jb, "BR": br, "KC": kc}


def _gemm(m: FamilyMatch, layer: int, variants: tuple[str, ...]) -> tuple[Region, KernelSpec, str]:
    """Layer ``layer``'s input projection as the first of the gemm family's ``variants`` that admits a
    configuration at its shapes (3xTF32 needs M a multiple of its tile), built at the one nearest its default."""
    f = m.facts
    g = m.graph
    like = g.node(f.node)
    per = 4 if f.biases else 2
    w_ih, *rest = f.weights[layer * per:layer * per + per]  # w_ih, w_hh (, b_ih, b_hh)
    src = Tensor(f.x, g.shape(f.x), "float32") if layer == 0 else Tensor(_y(f, layer - 1), _yshape(f), "float32")
    rows = src.shape[:2]
    gshape = (*rows, 4 * f.hidden)
    params = [g.tensor(w_ih)]
    proj = f"{f.node}_p{layer}" if f.biases else _g(f, layer)
    nodes = [aten_node(proj, "linear", "default", gshape, "float32", like, input=Ref(src.name), weight=Ref(w_ih),
                       bias=Ref(rest[1]) if f.biases else None)]
    if f.biases:  # G = x W_ih^T + b_ih, then + b_hh: the gemm's epilogue
        params += [g.tensor(rest[1]), g.tensor(rest[2])]
        nodes.append(aten_node(_g(f, layer), "add", "Tensor", gshape, "float32", like, self=Ref(proj),
                               other=Ref(rest[2])))
    gg = Graph((src,), tuple(params), tuple(nodes), Ref(nodes[-1].name))
    gm = GEMM.recognise(gg)
    if gm is None:
        raise NotCovered(f"the gemm family does not take layer {layer}'s input projection")
    gm.family = GEMM.name
    region = Region(2 * layer, gg, Lead.contraction, tuple(n.name for n in nodes), gm)
    for variant in variants:
        spec = GEMM.build(gm, variant)
        counted = admissible(spec, sizes={}, tensors=gm.tensor_facts(), gpu=limits_for("sm_90"), usable=lambda c: True)
        if counted.configs:
            return region, GEMM.build(gm, variant, counted.configs[0]), variant
    raise NotCovered(f"gemm {'/'.join(variants)} admits no configuration for layer {layer}'s projection: "
                     f"{counted.why()}")


def _g(f: Any, layer: int) -> str:
    return f"{f.node}_gates{layer}"


def _y(f: Any, layer: int) -> str:
    return f"{f.node}_y{layer}"


def _yshape(f: Any) -> tuple[int, int, int]:
    return (f.batch, f.steps, f.hidden) if f.batch_first else (f.steps, f.batch, f.hidden)


def _layer(m: FamilyMatch, layer: int) -> tuple[Graph, Node, str, list[Tensor]]:
    """Layer ``layer``'s recurrence as a region graph (its projected gates, h0 / c0 when given, W_hh), its node,
    W_hh's name and the h0 / c0 tensors."""
    f = m.facts
    g = m.graph
    gates = Tensor(_g(f, layer), (*_yshape(f)[:2], 4 * f.hidden), "float32")
    w_hh = f.weights[layer * (4 if f.biases else 2) + 1]
    hx = [g.tensor(n) for n in (f.h0, f.c0) if n is not None]
    node = Node(_y(f, layer), "lstm", "input", {}, _yshape(f), "float32")
    return Graph((gates, *hx), (g.tensor(w_hh),), (node,), Ref(node.name)), node, w_hh, hx


def _recurrence(m: FamilyMatch, layer: int, kind: Rec) -> tuple[Region, KernelSpec]:
    f = m.facts
    B, T, H = f.batch, f.steps, f.hidden
    rg, node, w_hh, hx = _layer(m, layer)
    common = {"B": B, "T": T, "H": H, "BATCH_FIRST": int(f.batch_first), "HOFF": layer * B * H}
    names = [str(rg.inputs[0].name), w_hh, *(t.name for t in hx), "hbuf", *(["cbuf"] if kind is Rec.step else []),
             "out"]
    args: list[Any] = [TensorArg(name=n) for n in names]
    if kind is Rec.splitk:
        sk = splitk_exprs(B, H)
        launch = Launch(kernel="lstm_splitk", grid=sk.grid, block=[sk.defines["NT"]], shared_mem=sk.smem, args=args,
                        cooperative=True)
        spec = KernelSpec(name="lstm-splitk", source=render("lstm_splitk.cu.j2", has_h0=bool(hx)),
                          defines={**common, "HK4": -(-H // 4) * 4, **sk.defines},
                          scratch=[Scratch(name="hbuf", size=2 * B * (-(-H // 4) * 4))], steps=[launch])
        return Region(2 * layer + 1, rg, Lead.rnn, (node.name,)), spec
    persistent = kind is Rec.persistent
    hp = -(-H // 4) * 4
    nt = f"JB * cdiv({B}, BR)"
    launch = dict(kernel="lstm_layer", grid=[f"cdiv({H}, JB)"], block=[nt],
                  shared_mem=f"(4 * JB * {hp} + {B} * (KC + 4)) * 4")
    if persistent:
        steps = [Launch(**launch, args=args, cooperative=True)]
    else:
        steps = [Launch(**launch, args=[*args, ScalarArg(kind="int32", value=t)]) for t in range(T)]
    spec = KernelSpec(
        name="lstm-layer", source=render("lstm_layer.cu.j2", persistent=persistent, has_h0=bool(hx)),
        defines={**common, "HP": hp, "BQ": f"cdiv({B}, BR)", "NT": nt},
        scratch=[Scratch(name="hbuf", size=2 * B * H), *([] if persistent else [Scratch(name="cbuf", size=B * H)])],
        steps=steps)
    return Region(2 * layer + 1, rg, Lead.rnn, (node.name,)), spec


def _knobs(f: Any, kind: Rec) -> tuple[dict[str, list[int]], dict[str, int], list[str], str]:
    """The recurrence's tunables, defaults, constraints and a description of it."""
    B, H = f.batch, f.hidden
    if kind is Rec.splitk:
        sk = splitk_exprs(B, H)
        return (SK_TUNABLES, sk.default(), sk.constraints,
                "in one cooperative launch, each block a tile of units x batch rows with its W_hh rows in shared "
                "memory, the step's product split over K across its warps (h staged by cp.async), a grid barrier a "
                "step")
    smem = f"(4 * JB * {-(-H // 4) * 4} + {B} * (KC + 4)) * 4"
    constraints = [f"JB * cdiv({B}, BR) <= 1024", f"BR <= max(1, {B})", f"JB <= max(1, {H})",
                   f"{smem} <= {MAX_SMEM - 1024}", *([f"cdiv({H}, JB) <= {COOP_NB}"] if kind is Rec.persistent else [])]
    desc = ("in one cooperative persistent launch (W_hh rows in shared memory, c in registers, a grid barrier a step)"
            if kind is Rec.persistent else "one launch per step (c in scratch)")
    return TUNABLES, _defaults(B, H), constraints, desc


def _build(m: FamilyMatch, defaults: dict[str, int], variant: str, gemm: tuple[str, ...], kind: Rec) -> KernelSpec:
    f = m.facts
    if kind is Rec.step and f.layers * (f.steps + 1) > MAX_STEPS:
        raise ValueError(f"{f.layers} layers of {f.steps} steps need {f.layers * (f.steps + 1)} launches, past a "
                         f"spec's {MAX_STEPS}: the persistent variants run a layer in one launch")
    regions, specs, labels = [], [], []
    for layer in range(f.layers):
        r, s, used = _gemm(m, layer, gemm)
        rr, rs = _recurrence(m, layer, kind)
        regions += [r, rr]
        specs += [s, rs]
        labels += [f"gemm {used} (layer {layer} projection)", f"lstm layer {layer}"]
    last = _y(f, f.layers - 1)
    storage = {t.name: t.name for t in (*m.inputs, *m.params)}
    for layer in range(f.layers):
        storage[_g(f, layer)] = GATES
        storage[_y(f, layer)] = "out" if _y(f, layer) == last else f"{YBUF}{layer % 2}"
    problem: dict[str, tuple[int, ...]] = {t.name: t.shape for t in (*m.inputs, *m.params)}
    problem["out"] = _yshape(f)
    joined = join(regions, specs, storage, problem, labels, f"playbook-lstm-{variant.replace('_', '-')}",
                  frozen={r.index for r in regions if r.lead is Lead.contraction})
    tunables, base, constraints, how = _knobs(f, kind)
    d = {**base, **{k: v for k, v in defaults.items() if k in tunables}}
    desc = (f"LSTM, {f.layers} layer(s) of hidden {f.hidden}, {f.steps} steps, batch {f.batch}: per layer the input "
            f"projection of every step as the gemm family's kernel ({labels[0].split(' (')[0]}), then the recurrence "
            + how)
    data = joined.model_dump()
    data.update(description=desc, tunables={**data["tunables"], **tunables},
                defaults={**data["defaults"], **d}, constraints=[*data["constraints"], *constraints])
    if kind is not Rec.step:  # a system header, outside every region's namespace
        data["source"] = "#include <cooperative_groups.h>\n" + data["source"]
    return KernelSpec.model_validate(data)


def lstm_splitk(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return _build(m, defaults, "splitk", ("tf32x3", "tiled"), Rec.splitk)


def lstm_persistent(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return _build(m, defaults, "persistent", ("tf32x3", "tiled"), Rec.persistent)


def lstm_persistent_ffma(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return _build(m, defaults, "persistent_ffma", ("tiled",), Rec.persistent)


def lstm_step(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return _build(m, defaults, "step", ("tiled",), Rec.step)
