"""A model plan as an ``nn.Module``: the original forward's inputs in (by position or by name), its output out; each kernel step a
``torch.library`` custom op (opaque to torch.compile, which fuses the ATen steps around it), each ATen step its
allowlisted ATen op. The weights are the given model's own (by their state names): nothing is read from a run
folder but the plan's data.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
from typing import Any

from kerngen.harness.gpu.op_call import register_op
from kerngen.harness.model.aten import GETITEM, PlanError
from kerngen.harness.model.execute import Launcher, PlanRunner
from kerngen.harness.model.plan import AtenStep, KernelStep, ModelPlan

__all__ = ["PlanModule"]

_COUNT = itertools.count()  # custom op names are process-wide: one namespace per module made


def _torch_module() -> Any:
    import torch

    return torch.nn.Module


class PlanModule(_torch_module()):  # type: ignore[misc]
    """``PlanModule(plan, model, launcher)(*inputs)``: the plan's output; ``model`` supplies the parameters and
    buffers (``model.<name>`` where a state name is taken by an input, as the harness names them)."""

    def __init__(self, plan: ModelPlan, model: Any, launcher: Launcher) -> None:
        super().__init__()
        self.model = model
        self.plan = plan
        self.runner = PlanRunner(plan, launcher)
        # the original forward's signature (its inputs by name): keyword calls work, inspect.signature shows it
        self.__signature__ = inspect.Signature([inspect.Parameter(t.name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                                for t in plan.inputs])
        tag = hashlib.sha256(plan.model_dump_json().encode()).hexdigest()[:8]
        ns = f"kerngen_model_{tag}_{next(_COUNT)}"
        self._steps: list[tuple] = []
        for i, s in enumerate(plan.steps):
            if isinstance(s, KernelStep):
                names = list(s.bindings)
                op = register_op(f"{ns}::s{i}", "(Tensor[] xs) -> Tensor", self._impl(i, s, names), self._fake(s))
                self._steps.append(("kernel", s.out.name, op, [s.bindings[n] for n in names]))
            elif s.op == GETITEM:
                self._steps.append(("item", s.node, s.args["input"]["ref"], int(s.args["index"])))
            else:
                self._steps.append(("aten", s.node, self.runner._fns[i], _plain(self.runner._fns[i], s)))
        taken = {t.name for t in plan.inputs}
        self._state = {f"model.{n}" if n in taken else n: n for n in (t.name for t in plan.params)}
        missing = [n for n in (t.name for t in plan.params) if n.removeprefix("model.") not in self._own()]
        if missing:
            raise PlanError(f"the model has no parameter or buffer {missing[0]!r} the plan reads")

    def _own(self) -> dict[str, Any]:
        return {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}

    def _impl(self, i: int, step: KernelStep, names: list[str]) -> Any:
        def run(xs: list) -> Any:
            env = dict(zip((step.bindings[n] for n in names), xs))
            return self.runner._kernel(i, step, env, xs[0].device)
        return run

    @staticmethod
    def _fake(step: KernelStep) -> Any:
        def fake(xs: list) -> Any:
            import torch

            from kerngen.harness.gpu.buffers import torch_dtype

            return torch.empty(step.out.shape, dtype=torch_dtype(step.out.dtype), device=xs[0].device)
        return fake

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        p = self.plan
        try:
            bound = self.__signature__.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"forward({', '.join(t.name for t in p.inputs)}): {exc}") from None
        inputs = [bound.arguments[t.name] for t in p.inputs]
        own = self._own()
        env: dict[str, Any] = {t.name: x for t, x in zip(p.inputs, inputs)}
        env.update({t.name: own[t.name.removeprefix("model.")] if t.name not in own else own[t.name]
                    for t in p.params})
        device = inputs[0].device
        env.update({k: torch.tensor(v, device=device) for k, v in p.constants.items()})
        for kind, name, what, how in self._steps:
            if kind == "kernel":
                env[name] = what([env[v] for v in how])
            elif kind == "item":
                env[name] = env[what][how]
            else:
                pos, kw = how
                env[name] = what(*[_value(a, env, device) for a in pos], **{k: _value(a, env, device)
                                                                           for k, a in kw.items()})
        return env[p.output]


def _plain(fn: Any, step: AtenStep) -> tuple[list, dict]:
    """The step's arguments in the op's order, positional and keyword, as plan JSON (decoded per call)."""
    pos, kw = [], {}
    for a in fn._schema.arguments:
        if a.name not in step.args:
            continue
        (kw.__setitem__(a.name, step.args[a.name]) if a.kwarg_only else pos.append(step.args[a.name]))
    return pos, kw


def _value(v: Any, env: dict[str, Any], device: Any) -> Any:
    from kerngen.harness.model.plan import decode_arg

    return decode_arg(v, env, device)
