"""Several regions, one kernel spec: the regions' own specs (each built by its family at the region's shapes) joined
into one candidate whose launch plan runs their kernels in order, each region's output in a scratch buffer that
the next regions read (the last writes ``out``).

Each region's names are namespaced so the parts cannot collide: its tunables and defines become ``r<i>_NAME``
(the tuner tunes every region's together; ``#define NAME r<i>_NAME`` before its source, ``#undef`` after), its
kernels ``r<i>_<kernel>``, its own scratch buffers ``r<i>_<name>``, its C code a ``namespace kg_r<i>`` (every
macro its source defines is undefined after it). A tensor a region reads is bound to where it lives
(:class:`.partition.Partition.storage`); a tensor that is not a problem tensor of the same shape (a scratch
buffer, a view) has its shape written into the region's expressions as numbers, so every expression resolves
against the problem's own tensors. Past :data:`~kerngen.harness.spec.spec.MAX_TUNABLES` tunables, the lighter
regions' tunables are fixed at their defaults (defines).
"""

from __future__ import annotations

import ast
import copy
import math
import re
from typing import Any, Mapping

from kerngen import expr
from kerngen.harness.spec.spec import MAX_TUNABLES, KernelSpec, Launch, Memset, ScalarArg, Scratch, TensorMapArg

from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.region import Region

__all__ = ["join"]

_HEAVY = (Lead.rnn, Lead.conv, Lead.contraction, Lead.attention)  # their regions keep their tunables first
_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)


class _Names:
    """How one region's names read in the joined spec."""

    def __init__(self, i: int, spec: KernelSpec, region: Region, storage: Mapping[str, str],
                 problem: Mapping[str, tuple[int, ...]], out_name: str, frozen: bool) -> None:
        self.prefix = f"r{i}_"
        self.macros = set(spec.tunables) | set(spec.defines)
        self.fixed = spec.default_config() if frozen else {}  # tunables fixed at their defaults: numbers here
        self.scratch = {s.name for s in spec.scratch}
        g = region.graph
        local = {t.name: t.shape for t in (*g.inputs, *g.params)}
        local["out"] = g.shape(g.output) or ()
        self.tensors = {name: (out_name if name == "out" else storage.get(name, name)) for name in local}
        # a tensor whose bound storage is not a problem tensor of this very shape: its shape is a number here
        self.literal = {name: shape for name, shape in local.items()
                        if problem.get(self.tensors[name]) != tuple(shape)}

    def tensor(self, name: str) -> str:
        if name in self.scratch:
            return self.prefix + name
        return self.tensors.get(name, name)

    def expr(self, text: Any) -> Any:
        """``text`` (an expression or an integer) over the joined spec's names."""
        if not isinstance(text, str):
            return text
        tree = copy.deepcopy(expr.parse(text))
        return re.sub(r"\._kg(\d+)_", r".\1", ast.unparse(_Rewrite(self).visit(tree)))


def _dotted_node(name: str) -> ast.AST:
    head, *rest = re.sub(r"\.(\d+)(?=\.|$)", r"._kg\1_", name).split(".")
    node: ast.AST = ast.Name(head, ast.Load())
    for part in rest:
        node = ast.Attribute(node, part, ast.Load())
    return node


class _Rewrite(ast.NodeTransformer):
    def __init__(self, names: _Names) -> None:
        self.n = names

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
            name = expr.dotted_name(node.value.value)
            if name is not None and name in self.n.literal:
                return ast.Constant(self.n.literal[name][ast.literal_eval(node.slice)])
            if name is not None:
                return ast.Subscript(ast.Attribute(_dotted_node(self.n.tensor(name)), "shape", ast.Load()),
                                     node.slice, ast.Load())
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        name = expr.dotted_name(node.value)
        if node.attr in ("numel", "ndim") and name is not None:
            if name in self.n.literal:
                shape = self.n.literal[name]
                return ast.Constant(math.prod(shape) if node.attr == "numel" else len(shape))
            return ast.Attribute(_dotted_node(self.n.tensor(name)), node.attr, ast.Load())
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.n.fixed:
            return ast.Constant(self.n.fixed[node.id])
        if node.id in self.n.macros:
            return ast.Name(self.n.prefix + node.id, ast.Load())
        return node


def _source(i: int, spec: KernelSpec, kernels: set[str], label: str) -> str:
    src = spec.source
    for k in sorted(kernels, key=len, reverse=True):
        src = re.sub(rf"\b{re.escape(k)}\b", f"r{i}_{k}", src)
    names = sorted(set(spec.tunables) | set(spec.defines))
    local = sorted(set(_DEFINE.findall(src)) - set(names))
    head = [f"// ---- region {i}: {label} ----", *(f"#define {n} r{i}_{n}" for n in names), f"namespace kg_r{i} {{"]
    tail = [f"}}  // namespace kg_r{i}", *(f"using kg_r{i}::r{i}_{k};" for k in sorted(kernels)),
            *(f"#undef {n}" for n in names + local)]
    return "\n".join(head) + "\n" + src.rstrip("\n") + "\n" + "\n".join(tail) + "\n"


def _step(i: int, step: Any, names: _Names) -> dict[str, Any]:
    if isinstance(step, Memset):
        return {"op": "memset", "tensor": names.tensor(step.tensor), "value": step.value}
    args = []
    for a in step.args:
        if isinstance(a, ScalarArg):
            args.append({"kind": a.kind, "value": names.expr(a.value)})
        elif isinstance(a, TensorMapArg):
            # every field kept (full_width, view: the 3xTF32 planes' TMA reads them), its names renamed
            args.append({**a.model_dump(), "name": names.tensor(a.name), "box_rows": names.expr(a.box_rows),
                         "box_cols": names.expr(a.box_cols),
                         "view": None if a.view is None else [names.expr(d) for d in a.view]})
        else:
            args.append({"name": names.tensor(a.name)})
    return {"op": "launch", "kernel": f"r{i}_{step.kernel}", "grid": [names.expr(e) for e in step.grid],
            "block": [names.expr(e) for e in step.block], "shared_mem": names.expr(step.shared_mem), "args": args,
            "cooperative": step.cooperative}


def _frozen(regions: list[Region], specs: list[KernelSpec]) -> set[int]:
    """The regions whose tunables are fixed at their defaults so the joined spec stays within MAX_TUNABLES."""
    order = sorted(range(len(specs)), key=lambda i: (regions[i].lead not in _HEAVY, -len(specs[i].tunables), i))
    kept, room = set(), MAX_TUNABLES
    for i in order:
        if len(specs[i].tunables) <= room:
            kept.add(i)
            room -= len(specs[i].tunables)
    return set(range(len(specs))) - kept


def join(regions: list[Region], specs: list[KernelSpec], storage: Mapping[str, str],
         problem: Mapping[str, tuple[int, ...]], labels: list[str], name: str,
         frozen: set[int] | None = None) -> KernelSpec:
    """One spec running ``specs`` (region ``i``'s, at its shapes) in order; ``storage`` says where each tensor
    lives (a problem tensor or ``r<k>_out``); ``problem``: the problem's own tensors' shapes by name; ``frozen``:
    the regions whose tunables are fixed at their defaults (default: the lighter ones past MAX_TUNABLES)."""
    if len({s.fast_math for s in specs}) > 1:
        raise ValueError("regions compiled with and without fast math cannot share one source")
    frozen = _frozen(regions, specs) if frozen is None else frozen
    source, tunables, defaults, defines, constraints, scratch, steps = [], {}, {}, {}, [], [], []
    out_dtype = {"r{}_out".format(r.index): r.output.dtype for r in regions}
    for i, (region, spec) in enumerate(zip(regions, specs)):
        out_name = storage.get(str(region.graph.output), "out")
        names = _Names(i, spec, region, storage, problem, out_name, i in frozen)
        kernels = {s.kernel for s in spec.steps if isinstance(s, Launch)}
        source.append(_source(i, spec, kernels, labels[i]))
        for k, values in spec.tunables.items():
            if i in frozen:
                defines[names.prefix + k] = spec.default_config()[k]
            else:
                tunables[names.prefix + k] = list(values)
                defaults[names.prefix + k] = spec.default_config()[k]
        defines.update({names.prefix + k: names.expr(v) for k, v in spec.defines.items()})
        constraints += [names.expr(c) for c in spec.constraints]
        scratch += [{"name": names.prefix + s.name, "dtype": s.dtype, "size": names.expr(s.size)} for s in spec.scratch]
        if out_name != "out" and out_name not in {s["name"] for s in scratch}:
            scratch.append({"name": out_name, "dtype": out_dtype.get(out_name, "float32"),
                            "size": math.prod(region.output.shape)})
        steps += [_step(i, s, names) for s in spec.steps]
    return KernelSpec(name=name, description="; ".join(f"r{i} {lab}: {s.description}"
                                                       for i, (lab, s) in enumerate(zip(labels, specs))),
                      source="\n".join(source), tunables=tunables, defaults=defaults,
                      constraints=list(dict.fromkeys(constraints)), defines=defines,
                      fast_math=specs[0].fast_math, arch_specific=any(s.arch_specific for s in specs),
                      scratch=[Scratch(**s) for s in scratch], steps=steps)
