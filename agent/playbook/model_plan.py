"""A whole model's plan from the playbook (issue 34): the problem's graph cut into regions (:mod:`.partition`),
each region a family serves at its shapes a kernel step (its spec from :func:`.regions.region_spec`), every other
node an ATen step named by its node in the problem's own graph, with why no kernel computes it (an op no family
covers, a region none of whose variants is admissible at its shapes, a view between regions). Never a refusal of
the whole model for one op: only a forward that cannot be traced, or a node a plan cannot hold (an op outside
the harness's allowlist), is refused, by name.

The plan is data (:class:`kerngen.harness.model.plan.ModelPlan`): the harness runs it, checks it and times it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kerngen.harness.model.aten import ALLOWED
from kerngen.harness.model.plan import AtenStep, KernelStep, ModelPlan, PlanTensor, encode_literal

from kerngen.agent.playbook.graph import Graph, Node, Ref, trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.partition import Partition, partition
from kerngen.agent.playbook.region import Region
from kerngen.agent.playbook.regions import region_offer, region_spec

__all__ = ["ModelPlanning", "RegionPlan", "assemble", "kernel_step", "plan_model", "plan_partition"]

VIEW_WHY = "a view between regions (no kernel: PyTorch makes the view, the next kernel reads it)"


@dataclass(frozen=True)
class RegionPlan:
    """What one region became: ``family``/``variant`` (a kernel step, with the variants offered at its shapes), or
    ``why`` it runs as PyTorch."""

    region: Region
    family: str = ""
    variant: str = ""
    offered: tuple[str, ...] = ()
    why: str = ""

    @property
    def kernel(self) -> bool:
        return bool(self.family)


@dataclass(frozen=True)
class ModelPlanning:
    plan: ModelPlan
    partition: Partition
    regions: tuple[RegionPlan, ...]
    views: tuple[str, ...] = field(default=())  # nodes run as views between regions

    @property
    def kernels(self) -> list[RegionPlan]:
        return [r for r in self.regions if r.kernel]

    @property
    def fallbacks(self) -> list[RegionPlan]:
        return [r for r in self.regions if not r.kernel]

    def lines(self) -> list[str]:
        """One line per region (its family and variant, or what runs as PyTorch and why), then the views."""
        out = []
        for r in self.regions:
            nodes = ", ".join(r.region.nodes)
            if r.kernel:
                out.append(f"r{r.region.index} kernel {r.family} {r.variant} [{nodes}] (offered: {', '.join(r.offered)})")
            else:
                out.append(f"r{r.region.index} PyTorch [{nodes}]: {r.why}")
        if self.views:
            out.append(f"views between regions (PyTorch, no copy): {', '.join(self.views)}")
        return out


def plan_model(problem: Any, variants: dict[int, str] | None = None,
               defaults: dict[int, dict[str, int]] | None = None) -> ModelPlanning:
    """The plan of ``problem``'s forward: region ``i`` a kernel of ``variants[i]`` (default: the first variant
    offered at its shapes) at its offered default configuration updated by ``defaults[i]``; NotCovered only for a
    forward that cannot be traced or a node no plan can hold."""
    g = trace(problem)
    info = getattr(problem, "info", None)
    sizes = dict(getattr(info, "sizes", None) or {})
    label = str(getattr(getattr(problem, "ref", None), "label", lambda: getattr(problem, "name", "problem"))())
    return plan_partition(partition(g), sizes, label, getattr(problem, "sha256", ""), variants or {}, defaults or {})


def plan_partition(part: Partition, sizes: dict[str, Any], label: str = "problem", sha256: str = "",
                   variants: dict[int, str] | None = None, defaults: dict[int, dict[str, int]] | None = None,
                   pytorch: dict[int, str] | None = None) -> ModelPlanning:
    """The plan of a partition; ``pytorch[i]``: region ``i`` runs as PyTorch for that reason (no offer asked)."""
    g = part.graph
    variants, defaults, pytorch = variants or {}, defaults or {}, pytorch or {}
    placed: dict[str, Region] = {n: r for r in part.regions for n in r.nodes}
    decided: dict[int, RegionPlan] = {
        r.index: RegionPlan(r, why=pytorch[r.index]) if r.index in pytorch else
        _decide(r, sizes, variants.get(r.index), defaults.get(r.index)) for r in part.regions}
    steps: list[Any] = []
    views: list[str] = []
    done: set[int] = set()
    for n in g.live():
        r = placed.get(n.name)
        if r is None:
            views.append(n.name)
            steps.append(_aten(g, n, None, VIEW_WHY))
            continue
        rp = decided[r.index]
        if not rp.kernel:
            steps.append(_aten(g, n, r.index, rp.why))
        elif r.index not in done:
            done.add(r.index)
            steps.append(_kernel(rp, sizes, defaults.get(r.index)))
    plan = ModelPlan(problem=label, problem_sha256=sha256, inputs=[_t(t) for t in g.inputs],
                     params=[_t(t) for t in g.params if t.name in _read(g)], constants=dict(g.constants),
                     steps=steps, output=str(g.output))
    plan.check_names()
    return ModelPlanning(plan, part, tuple(decided[r.index] for r in part.regions), tuple(views))


def kernel_step(region: Region, variant: str, sizes: dict[str, Any], defaults: dict[str, int] | None = None
                ) -> KernelStep:
    """Region ``region`` as a kernel step of ``variant`` (NotCovered when not offered at its shapes)."""
    return _kernel(RegionPlan(region, region.match.family if region.match else "", variant), sizes, defaults)


def assemble(base: ModelPlan, kernels: dict[int, KernelStep]) -> ModelPlan:
    """``base`` (a plan whose regions run as PyTorch or as kernels) with each region of ``kernels`` computed by its
    kernel step instead, in the place of the region's first step."""
    steps: list[Any] = []
    for s in base.steps:
        r = s.region
        if r in kernels:
            if not any(isinstance(t, KernelStep) and t.region == r for t in steps):
                steps.append(kernels[r])
            continue
        steps.append(s)
    plan = base.model_copy(update={"steps": steps})
    plan.check_names()
    return plan


def _read(g: Graph) -> set[str]:
    return {str(r) for n in g.live() for r in n.refs}


def _t(t: Any) -> PlanTensor:
    return PlanTensor(name=t.name, shape=tuple(t.shape), dtype=t.dtype)


def _decide(r: Region, sizes: dict[str, Any], variant: str | None, defaults: dict[str, int] | None) -> RegionPlan:
    if r.match is None:
        return RegionPlan(r, why=r.why or "no family covers it")
    try:
        off = region_offer(r, sizes)
    except NotCovered as exc:
        return RegionPlan(r, why=str(exc))
    offered = tuple(v.variant for v in off.offered)
    if not offered:
        return RegionPlan(r, why=f"{r.match.family}: no variant admissible at its shapes ({off.reason})")
    chosen = variant or offered[0]
    if chosen not in offered:
        return RegionPlan(r, why=f"{r.match.family} {chosen}: {off.why_not(chosen)}")
    return RegionPlan(r, r.match.family, chosen, offered)


def _kernel(rp: RegionPlan, sizes: dict[str, Any], defaults: dict[str, int] | None) -> KernelStep:
    r = rp.region
    spec = region_spec(r, rp.variant, defaults, sizes)
    bindings = {t.name: t.name for t in (*r.inputs, *r.params)}
    out = r.output
    return KernelStep(region=r.index, family=rp.family, variant=rp.variant, nodes=list(r.nodes), spec=spec,
                      config=spec.default_config(), sizes={k: v for k, v in sizes.items()
                                                           if isinstance(v, (int, float)) and not isinstance(v, bool)},
                      bindings=bindings, out=PlanTensor(name=out.name, shape=out.shape, dtype=out.dtype))


def _aten(g: Graph, n: Node, region: int | None, why: str) -> AtenStep:
    if n.op not in ALLOWED:
        raise NotCovered(f"{n.op} at {n.name}: not an op a model plan may run as PyTorch (not in the allowlist)")
    try:
        args = {k: _arg(v) for k, v in n.args.items()}
    except ValueError as exc:
        raise NotCovered(f"{n.op} at {n.name}: {exc}") from None
    return AtenStep(node=n.name, op=n.op, overload=n.overload, args=args, region=region, why=why)


def _arg(v: Any) -> Any:
    if isinstance(v, Ref):
        return {"ref": str(v)}
    if isinstance(v, tuple):
        return [_arg(x) for x in v]
    return encode_literal(v)
