"""Which configurations of a kernel spec are admissible at a problem's shape, without a GPU.

One resolution for every command that asks (``kerngen check`` reports it, the offline playbook
offers a family or variant only when it admits at least one configuration):

* :func:`admissible` enumerates the spec's configurations (all of them, or a seeded sample of
  :data:`CONFIG_LIMIT` for larger spaces, as the tuner does) and keeps those that pass the tuner's
  static pruning (:func:`kerngen.harness.tune.prune.static_prune`: constraints, plans that do not
  resolve, threads per block, dynamic shared memory); with ``compile_all`` every survivor is also
  compiled through the normal compile boundary and checked for launch arguments and resources.
* :func:`limits_for` gives the limits of a target (``sm_90``, ...) with no device to ask.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kerngen.expr import TensorFacts
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.prune import (PrunedConfig, enumerate_configs, examples, static_prune, static_reason,
                                        summarize)
from kerngen.text import one_line

__all__ = ["CONFIG_LIMIT", "SMEM_OPTIN", "Admissible", "admissible", "closest", "compile_stage", "count_configs",
           "limits_for", "nearest_first"]

CONFIG_LIMIT = 10_000  # larger spaces are counted on a seeded sample of this many configurations

# Max dynamic + static shared memory per block with opt-in, by compute capability (CUDA C
# Programming Guide, "Technical Specifications per Compute Capability"); 1024 threads and 64 K
# registers per block on all of them. Other targets get the sm_90 figures.
SMEM_OPTIN = {
    70: 96 * 1024, 72: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024,
    89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 101: 227 * 1024, 103: 227 * 1024, 110: 227 * 1024,
    120: 99 * 1024, 121: 99 * 1024,
}  # fmt: skip


def limits_for(arch: str) -> GpuFacts:
    """GpuFacts with the limits of ``arch`` (no device is asked)."""
    m = re.match(r"^sm_(\d+)", arch)
    cc = int(m.group(1)) if m else 90
    facts = GpuFacts(name=f"{arch} limits", arch=arch)
    if cc in SMEM_OPTIN:
        facts.max_shared_per_block_optin = SMEM_OPTIN[cc]
    return facts


def compile_stage(message: str) -> str:
    """The check a compile error belongs to (``kerngen check``'s stages)."""
    if message.startswith("forbidden:"):
        return "forbidden"
    if message.startswith("launch arguments:"):
        return "arguments"
    if message.startswith("kernel '") and "not found" in message:
        return "kernels"
    return "compile"


@dataclass
class Admissible:
    """The admissible configurations of a spec at one shape, for one GPU's limits."""

    total: int  # the size of the spec's space
    enumerated: int  # how many configurations were judged (fewer than total: a sample)
    configs: list[dict[str, int]]  # the admissible ones, in enumeration order
    pruned: list[PrunedConfig] = field(default_factory=list)
    compiled: bool = False
    # judging stopped at the first usable admissible configuration (:func:`admissible`'s ``usable``): ``configs``
    # are the admissible ones judged before it, nearest the default first, and it; ``count`` is a lower bound
    stopped: bool = False

    @property
    def count(self) -> int:
        return len(self.configs)

    @property
    def sampled(self) -> bool:
        return self.enumerated < self.total

    def report(self) -> dict[str, Any]:
        """As ``kerngen check`` prints it (``configs`` of its JSON)."""
        return {"total": self.total, "enumerated": self.enumerated, "sampled": self.sampled,
                "compiled": self.compiled, "admissible": self.count,
                "first_admissible": self.configs[0] if self.configs else None,
                "pruned": summarize(self.pruned),
                "examples": {k: one_line(v, 300) for k, v in examples(self.pruned).items()}}

    def why(self, limit: int = 300) -> str:
        """One line: how many configurations are admissible and, per reason kind, how many were
        pruned with the most frequent reason of that kind, e.g. ``0 of 64 configurations admissible:
        64 pruned by constraint (B.shape[1] % BN == 0)``."""
        sample = f" (a sample of {self.enumerated})" if self.sampled else ""
        head = f"{self.count} of {self.total} configurations{sample} admissible"
        by_kind: dict[str, Counter] = {}
        for p in self.pruned:
            by_kind.setdefault(p.kind, Counter())[_plain(p.reason)] += 1
        parts = [f"{n} pruned by {kind} ({one_line(by_kind[kind].most_common(1)[0][0], limit)})"
                 for kind, n in summarize(self.pruned).items()]
        return head + (": " + "; ".join(parts) if parts else "")

    def brief(self, limit: int = 160) -> str:
        """Shorter: ``0 of 64 configurations (B.shape[1] % BN == 0)``, the most frequent reason."""
        top = Counter(_plain(p.reason) for p in self.pruned).most_common(1)
        return f"{self.count} of {self.total} configurations" + (f" ({one_line(top[0][0], limit)})" if top else "")


def _plain(reason: str) -> str:
    return reason.removeprefix("constraint violated: ")


def admissible(
    spec: KernelSpec,
    *,
    sizes: Mapping[str, int | float],
    tensors: Mapping[str, TensorFacts],
    gpu: GpuFacts,
    arch: str | None = None,
    compile_all: bool = False,
    usable: Callable[[dict[str, int]], bool] | None = None,
) -> Admissible:
    """The admissible configurations of ``spec``: static pruning (constraints, plans that do not
    resolve, threads, dynamic shared memory), and with ``compile_all`` the compile, argument and
    resource checks of every survivor for ``arch`` (default: ``gpu.arch``).

    With ``usable`` (static pruning only), the same configurations are judged nearest the spec's
    default first (:func:`nearest_first`) and judging stops at the first admissible one for which
    ``usable`` holds (``stopped``): whether one exists and which is :func:`closest` to the default,
    as the full count would say, without counting (most defaults are admissible: one configuration
    judged instead of thousands). Where none is usable every configuration was judged: the result
    is the full one, in enumeration order."""

    if usable is not None:
        return _first_usable(spec, sizes, tensors, gpu, usable)
    configs = enumerate_configs(spec, seed=0, limit=CONFIG_LIMIT)
    survivors, pruned = static_prune(spec, configs, sizes=sizes, tensors=tensors, gpu=gpu)
    out = Admissible(total=spec.space_size(), enumerated=len(configs), configs=[c for c, _ in survivors],
                     pruned=pruned)
    if compile_all and survivors:
        out.configs = _compiled(spec, survivors, pruned, gpu, arch or gpu.arch)
        out.compiled = True
    return out


def _first_usable(spec: KernelSpec, sizes: Mapping[str, int | float], tensors: Mapping[str, TensorFacts],
                  gpu: GpuFacts, usable: Callable[[dict[str, int]], bool]) -> Admissible:
    total = spec.space_size()
    default = spec.default_config()  # always among the enumerated (a sample keeps it), and first in their order
    if usable(default) and static_reason(spec, default, sizes=sizes, tensors=tensors, gpu=gpu)[0] is not None:
        return Admissible(total=total, enumerated=min(total, CONFIG_LIMIT), configs=[default], stopped=True)
    configs = enumerate_configs(spec, seed=0, limit=CONFIG_LIMIT)
    order = sorted(range(len(configs)), key=nearest_first(default, configs, spec.tunables))
    survivors, pruned = static_prune(spec, [configs[i] for i in order], sizes=sizes, tensors=tensors, gpu=gpu,
                                     until=usable)
    out = Admissible(total=total, enumerated=len(configs), configs=[c for c, _ in survivors], pruned=pruned)
    if len(survivors) + len(pruned) < len(configs):
        out.stopped = True
        return out
    at = {tuple(configs[i].values()): i for i in order}  # all judged: back in enumeration order, as the full count
    out.configs.sort(key=lambda c: at[tuple(c.values())])
    out.pruned.sort(key=lambda p: at[tuple(p.config.values())])
    return out


def nearest_first(default: Mapping[str, int], configs: list[dict[str, int]],
                  tunables: Mapping[str, list[int]]) -> Callable[[int], tuple[int, int, int]]:
    """A sort key over the indices of ``configs``: fewest tunables changed from ``default``, then
    the fewest steps along the tunables' value lists, then the first in order."""
    pos = {k: {v: i for i, v in reversed(list(enumerate(values)))} for k, values in tunables.items()}
    home = {k: pos[k][v] for k, v in default.items() if k in pos and v in pos[k]}

    def key(i: int) -> tuple[int, int, int]:
        cfg = configs[i]
        changed = [k for k in cfg if cfg[k] != default.get(k)]
        return len(changed), sum(abs(pos[k][cfg[k]] - home[k]) for k in changed if k in home), i

    return key


def closest(default: Mapping[str, int], configs: list[dict[str, int]], tunables: Mapping[str, list[int]]) -> dict[str, int]:
    """The configuration of ``configs`` nearest ``default`` (:func:`nearest_first`)."""
    return configs[min(range(len(configs)), key=nearest_first(default, configs, tunables))]


def _compiled(spec: KernelSpec, survivors: list, pruned: list[PrunedConfig], gpu: GpuFacts, arch: str) -> list[dict[str, int]]:
    """The survivors that also compile, pass the argument check and fit the GPU's resources (the
    others are added to ``pruned``)."""
    from kerngen.errors import CompileError
    from kerngen.harness.compile.compiler import compile_many, job_for
    from kerngen.harness.spec.kparams import plan_problems
    from kerngen.harness.tune.prune import resource_reason

    kept = []
    results = compile_many([job_for(spec, plan, arch) for _, plan in survivors])
    for (cfg, plan), res in zip(survivors, results):
        if isinstance(res, CompileError):
            pruned.append(PrunedConfig(config=cfg, kind=compile_stage(str(res)), reason=str(res)))
            continue
        problems = plan_problems(res.cubin, plan)
        if problems:
            pruned.append(PrunedConfig(config=cfg, kind="arguments", reason=problems[0]))
            continue
        kind, reason = resource_reason(plan, res.info, gpu)
        if kind:
            pruned.append(PrunedConfig(config=cfg, kind=kind, reason=reason))
            continue
        kept.append(cfg)
    return kept


def count_configs(spec: KernelSpec, info: Any, gpu: GpuFacts, arch: str, compile_all: bool) -> dict[str, Any]:
    """:func:`admissible` at a problem's shape (``info``: its ``sizes`` and ``tensor_facts()``), as
    the report ``kerngen check`` prints."""
    return admissible(spec, sizes=info.sizes, tensors=info.tensor_facts(), gpu=gpu, arch=arch,
                      compile_all=compile_all).report()
