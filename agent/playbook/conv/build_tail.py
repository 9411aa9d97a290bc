"""Variant builders of the conv_tail family: the convolution and its elementwise epilogue (conv_epi's
``igemm``, ``direct``, ``depthwise`` or, on Hopper, ``wgmma`` kernel, which names the variant) into a scratch buffer,
then one kernel per stage of the tail (:mod:`.conv.tail_trace`), all in one source:

- ``stats`` (``conv_tail_segment.cu.j2``): a block per (sample, group) writes (mean, rstd);
- ``segment``: a block per plane or sample reduces it (global pooling, sums over all but the batch);
- ``channels`` (``conv_tail_channels.cu.j2``): a thread per (sample, position) folds the C channels;
- ``window`` and ``map`` (``conv_tail_window.cu.j2``): a thread per output (pool window, or one element).

Each stage kernel evaluates its prologue chain at every input position (the leaves its chain reads:
the domain's buffer, parameters, a norm's statistics: applying a norm is a prologue), reduces, applies
its epilogue chain and stores its domain's buffer or the output. Sizes enter as defines over the bound
tensors (``K<i>_N``, ``K<i>_C``, ``K<i>_H``, ``K<i>_W`` of the stage's input; the window's ``K<i>_OH``,
``K<i>_OW``); the tail kernels share the tunables ``TAIL_BLOCK`` and ``TAIL_ILP``."""

from __future__ import annotations

from typing import Any, Callable

from kerngen.agent.playbook.conv import build_epi as build_conv_epi
from kerngen.agent.playbook.conv.build_wgmma import conv_epi_wgmma
from kerngen.agent.playbook.conv.tail_ir import LeafKind, Reduction, Stage, StageKind, Tail
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.graph import Tensor
from kerngen.agent.playbook.render import make_spec, pick, render
from kerngen.harness.spec.spec import KernelSpec

__all__ = ["CONV_BUILDERS", "SPEC_PREFIX", "TAIL_TUNABLES", "VARIANT_NAMES", "conv_tail_spec"]

SPEC_PREFIX = "playbook-conv-tail-"  # + variant
VARIANT_NAMES = ("igemm", "direct", "depthwise", "wgmma")  # wgmma: Hopper only (coverage), 3xTF32 at fp32 accuracy
CONV_BUILDERS: dict[str, Callable[[FamilyMatch, dict[str, int]], KernelSpec]] = {
    "igemm": build_conv_epi.conv_epi_igemm, "direct": build_conv_epi.conv_epi_direct,
    "depthwise": build_conv_epi.conv_epi_depthwise, "wgmma": conv_epi_wgmma}
# the tail kernels share two tunables: threads a block, and loads a thread has in flight (positions or
# outputs a thread, a statistics batch). Few values on purpose: they multiply the convolution's space,
# which coverage and the tuner walk, while the convolution dominates the time
TAIL_TUNABLES: dict[str, tuple[list[int], int]] = {"TAIL_BLOCK": ([128, 256, 512, 1024], 256),
                                                   "TAIL_ILP": ([1, 4], 4)}
_TEMPLATES = {StageKind.stats: "conv_tail_segment.cu.j2", StageKind.segment: "conv_tail_segment.cu.j2",
              StageKind.channels: "conv_tail_channels.cu.j2", StageKind.window: "conv_tail_window.cu.j2",
              StageKind.map: "conv_tail_window.cu.j2"}
_OPS = {Reduction.sum: 0, Reduction.mean: 0, Reduction.max: 1, Reduction.min: 2}  # the templates' fold: ct_combine<OP>


def _buffer(d: int) -> str:
    return f"ct_b{d}"


def _stats(j: int) -> str:
    return f"ct_s{j}"


class _Kernel:
    """One stage kernel's pointer operands (``a0``, ``a1``, ... in order of first use) and the C that
    defines the leaves its chains read."""

    def __init__(self, tail: Tail) -> None:
        self.tail = tail
        self.names: list[str] = []

    def ptr(self, name: str) -> str:
        if name not in self.names:
            self.names.append(name)
        return f"a{self.names.index(name)}"

    def fn(self, chain: Any) -> dict[str, Any]:
        """Template vars of one device function: leaf definitions, statements, the returned value."""
        defs = []
        for i in self.tail.leaves_of(chain):
            leaf = self.tail.leaves[i]
            if leaf.kind == LeafKind.buffer:
                value = f"__ldg({self.ptr(_buffer(int(leaf.ref)))} + idx)"
            elif leaf.kind == LeafKind.channel:
                value = f"__ldg({self.ptr(str(leaf.ref))} + c)"
            elif leaf.kind == LeafKind.scalar:
                value = f"__ldg({self.ptr(str(leaf.ref))})"
            elif leaf.kind in (LeafKind.mean, LeafKind.rstd):
                st = self.tail.stats_stage(int(leaf.ref))
                cpg = self.tail.domains[st.src].values[1] // st.groups
                at = f"2 * ((long long)n * {st.groups} + c / {cpg}){' + 1' if leaf.kind == LeafKind.rstd else ''}"
                value = f"__ldg({self.ptr(_stats(int(leaf.ref)))} + {at})"
            elif leaf.kind == LeafKind.result:
                value = "r"
            else:  # the conv's output exists only inside the conv kernel
                raise ValueError(f"leaf {leaf} has no value in a tail kernel")
            defs.append(f"const float q{i} = {value};")
        return dict(defs=defs, statements=list(chain.statements()), expr=chain.expr())


def _conv_match(m: FamilyMatch) -> FamilyMatch:
    """The match conv_epi's builders read: the conv and its epilogue, its output being domain 0."""
    d0 = m.facts.tail.domains[0]
    return FamilyMatch("conv_epi", m.inputs, m.params, [Tensor("out", d0.values, "float32")], m.facts,
                      precision=m.precision)


def _what(s: Stage) -> str:
    if s.kind == StageKind.stats:
        return f"norm statistics, {s.groups} groups a sample: a block per (sample, group) writes (mean, rstd)"
    if s.kind == StageKind.map:
        return "the elementwise rest (norms applied) into the output, a thread per element"
    if s.kind == StageKind.window:
        return (f"{s.op.value} pooling {s.kernel[0]}x{s.kernel[1]} stride {s.stride[0]}x{s.stride[1]} padding "
                f"{s.padding[0]}x{s.padding[1]}, a thread per output")
    if s.kind == StageKind.channels:
        return f"{s.op.value} over the channels, a thread per (sample, position)"
    return f"{s.op.value} over each {'sample' if s.per_sample else 'plane'}, a block per segment"


def _stage(tail: Tail, i: int, s: Stage) -> tuple[str, dict, dict[str, str], list[str], list]:
    """(source, launch step, defines, constraints, scratch) of stage ``i``."""
    p = f"K{i}_"
    kernel = f"conv_tail_k{i}_{s.kind.value}"
    dom = tail.domains[s.src]
    k = _Kernel(tail)
    pro = k.fn(s.pro)
    epi = k.fn(s.epi) if s.epi is not None else None
    block, second = TAIL_TUNABLES
    defines = {f"{p}N": dom.n, f"{p}C": dom.c, f"{p}H": dom.h, f"{p}W": dom.w}
    constraints: list[str] = []
    scratch: list[dict] = []
    total_in = f"{p}N * {p}C * {p}H * {p}W"
    if s.kind == StageKind.stats:
        target = _stats(s.stats)
        cps = dom.values[1] // s.groups
        scratch.append(dict(name=target, dtype="float32", size=f"2 * ({dom.n}) * {s.groups}"))
        constraints += [f"{dom.c} == {dom.values[1]}", f"{cps} * ({dom.h}) * ({dom.w}) < 2**24"]
        grid = f"{p}N * {s.groups}"
    elif s.kind == StageKind.segment:
        cps = f"{p}C" if s.per_sample else 1
        grid = f"{p}N" if s.per_sample else f"{p}N * {p}C"
        constraints.append(f"({dom.c}) * ({dom.h}) * ({dom.w}) < 2**24" if s.per_sample else
                           f"({dom.h}) * ({dom.w}) < 2**24")
    elif s.kind == StageKind.channels:
        cps = 1
        grid = f"cdiv({p}N * {p}H * {p}W, {block} * {second})"
    else:
        cps = 1
        if s.kind == StageKind.window:
            kh, kw = s.kernel
            (sh, sw), (ph, pw) = s.stride, s.padding
            defines[f"{p}OH"] = f"(({dom.h}) + {2 * ph - kh}) // {sh} + 1"
            defines[f"{p}OW"] = f"(({dom.w}) + {2 * pw - kw}) // {sw} + 1"
            constraints += [f"{defines[f'{p}OH']} >= 1", f"{defines[f'{p}OW']} >= 1"]
            total_out = f"{p}N * {p}C * {p}OH * {p}OW"
        else:
            total_out = total_in
        grid = f"cdiv({total_out}, {block} * {second})"
    if s.kind != StageKind.stats:
        target = _buffer(s.dst) if s.store else "out"
        if s.store:
            scratch.append(dict(name=target, dtype="float32", size=tail.domains[s.dst].size))
    src = render(_TEMPLATES[s.kind], p=p, kernel=kernel, what=_what(s), kind=s.kind.value,
                 op=s.op.value if s.op is not None else "", fold=_OPS.get(s.op, 0), pro=pro, epi=epi,
                 n_args=len(k.names), block=block, second=second, cps=cps, eps=repr(float(s.eps)),
                 kernel_hw=list(s.kernel), stride=list(s.stride), padding=list(s.padding),
                 count_include_pad=s.count_include_pad)
    constraints.append(f"({dom.size}) < 2**40")
    step = dict(kernel=kernel, grid=[grid], block=[block], args=[{"name": n} for n in k.names] + [{"name": target}])
    return src, step, defines, constraints, scratch


def _param_checks(m: FamilyMatch) -> list[str]:
    tail: Tail = m.facts.tail
    out = []
    for leaf in tail.leaves:
        if leaf.kind == LeafKind.channel:
            out.append(f"{leaf.ref}.numel == {m.facts.weight}.shape[0]")
        elif leaf.kind == LeafKind.scalar:
            out.append(f"{leaf.ref}.numel == 1")
    return sorted(set(out))


def conv_tail_spec(variant: str, m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    tail: Tail = m.facts.tail
    conv = CONV_BUILDERS[variant](_conv_match(m), defaults)
    if (variant == "depthwise") != (m.facts.G == m.facts.C):
        which = "" if variant == "depthwise" else "non-"
        raise ValueError(f"the {variant} kernel is for {which}depthwise convolutions")
    tun = pick(defaults, {name: d for name, (_, d) in TAIL_TUNABLES.items()})
    sources, steps, defines, constraints, scratch = [conv.source], [], dict(conv.defines), list(conv.constraints), []
    for i, s in enumerate(tail.stages, start=1):
        src, step, defs, cons, scr = _stage(tail, i, s)
        sources.append(src)
        steps.append(step)
        defines.update(defs)
        constraints += cons
        scratch += scr
    b0 = _buffer(0)
    conv_steps = []
    for st in conv.steps:
        d = st.model_dump()
        d["args"] = [({"name": b0} if a.get("name") == "out" else a) for a in d["args"]]
        conv_steps.append(d)
    tunables = {**conv.tunables, **{name: values for name, (values, _) in TAIL_TUNABLES.items()}}
    return make_spec(
        SPEC_PREFIX + variant,
        f"{conv.description}; into a scratch tensor y0, then the tail ({tail.summary()}) in {len(tail.stages)} more "
        "launches: " + "; ".join(f"({i}) {_what(s)}" for i, s in enumerate(tail.stages, start=1)),
        "\n".join(sources),
        tunables,
        {**conv.defaults, **tun},
        defines=defines,
        scratch=[s.model_dump() for s in conv.scratch] + [dict(name=b0, dtype="float32", size=tail.domains[0].size)]
        + scratch,
        constraints=constraints + _param_checks(m),
        steps=conv_steps + steps, arch_specific=conv.arch_specific,
    )
