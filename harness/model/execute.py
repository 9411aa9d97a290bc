"""Run a :class:`~.plan.ModelPlan` on tensors: ATen steps as their allowed ATen ops, kernel steps through an
injected launcher (the CUDA one here, :func:`cuda_launcher`; the CPU tests inject the emulator), each kernel
step's output and scratch allocated fresh (and, when checking, filled with a poison first, so that an element a
kernel does not write never passes as the reference's).

A kernel step's plan is resolved once per shapes of what it binds (the spec's constraints checked then).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping

from kerngen.errors import SpecError
from kerngen.expr import TensorFacts
from kerngen.harness.model.aten import GETITEM, PlanError, resolve_op
from kerngen.harness.model.plan import AtenStep, KernelStep, ModelPlan, decode_arg
from kerngen.harness.spec.plan import ResolvedPlan, resolve
from kerngen.harness.spec.spec import KernelSpec

__all__ = ["Launcher", "PlanRunner", "cuda_launcher"]

# (step index, spec, resolved plan, tensors by the spec's names incl. "out" and scratch) -> None (writes in place)
Launcher = Callable[[int, KernelSpec, ResolvedPlan, Mapping[str, Any]], None]


class PlanRunner:
    """``runner(values)``: the plan's output for ``values`` (every input and parameter by name).
    ``poison``: a value every kernel output and scratch buffer holds before its kernel runs (None: left as
    allocated)."""

    def __init__(self, plan: ModelPlan, launcher: Launcher, poison: float | None = None) -> None:
        plan.check_names()
        self.plan, self.launcher, self.poison = plan, launcher, poison
        self._fns = {i: resolve_op(s.op, s.overload) for i, s in enumerate(plan.steps)
                     if isinstance(s, AtenStep) and s.op != GETITEM}
        self._plans: dict[tuple, ResolvedPlan] = {}
        self.kernel_calls = 0  # kernels launched (proof that they ran)

    def __call__(self, values: Mapping[str, Any], keep: bool = False) -> Any:
        import torch

        p = self.plan
        missing = [t.name for t in (*p.inputs, *p.params) if t.name not in values]
        if missing:
            raise PlanError(f"no tensor given for {missing[0]!r}")
        device = values[p.inputs[0].name].device if p.inputs else torch.device("cpu")
        env: dict[str, Any] = dict(values)
        env.update({k: torch.tensor(v, device=device) for k, v in p.constants.items()})
        for i in range(len(p.steps)):
            self.run_step(i, env, device)
        return (env[p.output], env) if keep else env[p.output]

    def run_step(self, i: int, env: dict[str, Any], device: Any) -> Any:
        """Step ``i`` on the values of ``env`` (its value stored there and returned)."""
        step = self.plan.steps[i]
        if isinstance(step, KernelStep):
            value = env[step.out.name] = self._kernel(i, step, env, device)
        elif step.op == GETITEM:
            value = env[step.node] = operator.getitem(decode_arg(step.args["input"], env, device),
                                                      int(step.args["index"]))
        else:
            value = env[step.node] = self._aten(i, step, env, device)
        return value

    def _aten(self, i: int, step: AtenStep, env: dict[str, Any], device: Any) -> Any:
        fn = self._fns[i]
        pos, kw = [], {}
        for a in fn._schema.arguments:
            if a.name not in step.args:
                if a.has_default_value():
                    continue
                raise PlanError(f"step {i} ({step.node}): no value for {a.op}.{a.name}")
            v = decode_arg(step.args[a.name], env, device)
            if a.kwarg_only:
                kw[a.name] = v
            else:
                pos.append(v)
        return fn(*pos, **kw)

    def resolved(self, i: int, step: KernelStep, tensors: Mapping[str, Any]) -> ResolvedPlan:
        key = (i, tuple((n, tuple(t.shape)) for n, t in tensors.items()))
        got = self._plans.get(key)
        if got is None:
            facts = {n: TensorFacts(tuple(t.shape)) for n, t in tensors.items()}
            try:
                got = self._plans[key] = resolve(step.spec, sizes=step.sizes, tensors=facts, config=step.config)
            except SpecError as exc:
                raise PlanError(f"step {i} (region {step.region}, {step.family}): {exc}") from None
        return got

    def _kernel(self, i: int, step: KernelStep, env: dict[str, Any], device: Any) -> Any:
        import torch

        from kerngen.harness.gpu.buffers import torch_dtype

        tensors: dict[str, Any] = {}
        for name, value in step.bindings.items():
            t = env.get(value)
            if t is None:
                raise PlanError(f"step {i} (region {step.region}) reads {value!r} before any step makes it")
            tensors[name] = t if t.is_contiguous() else t.contiguous()
        out = torch.empty(step.out.shape, dtype=torch_dtype(step.out.dtype), device=device)
        tensors["out"] = out
        plan = self.resolved(i, step, tensors)
        for s in plan.scratch:
            tensors[s.name] = torch.empty((s.size,), dtype=torch_dtype(s.dtype), device=device)
        if self.poison is not None:
            for name, t in tensors.items():
                if (name == "out" or name not in step.bindings) and t.is_floating_point():
                    t.fill_(self.poison)
        self.launcher(i, step.spec, plan, tensors)
        self.kernel_calls += 1
        return out


def cuda_launcher() -> Launcher:
    """Kernel steps on a CUDA device: each step's spec compiled with the harness's NVRTC job once per resolved
    configuration and device, bound once per shapes (:mod:`kerngen.harness.gpu.op_runtime`), launched on
    torch's current stream."""
    from kerngen.harness.gpu.op_runtime import CudaBinder, DescriptorCache, Slots, write_descriptor

    descriptors = DescriptorCache(write_descriptor)
    # keyed by the spec's content, never by the step's position: one launcher serves many plans (every variant
    # a region tries sits at the same step index), and a binder holds its spec's source
    binders: dict[str, CudaBinder] = {}
    runners: dict[tuple, Any] = {}

    def cubin(spec: KernelSpec) -> Callable[[ResolvedPlan, int], bytes]:
        def build(plan: ResolvedPlan, device: int) -> bytes:
            import torch

            from kerngen.harness.compile.compiler import compile_job, job_for
            from kerngen.harness.compile.nvrtc_info import arch_for_capability

            arch = arch_for_capability(*torch.cuda.get_device_capability(device))
            return compile_job(job_for(spec, plan, arch)).cubin
        return build

    def launch(i: int, spec: KernelSpec, plan: ResolvedPlan, tensors: Mapping[str, Any]) -> None:
        import torch

        names = tuple(tensors)
        device = next(iter(tensors.values())).device.index or 0
        spec_key = spec.content_hash()
        key = (spec_key, device, names, tuple(tuple(t.shape) for t in tensors.values()),
               tuple(sorted(plan.config.items())))
        runner = runners.get(key)
        if runner is None:
            binder = binders.get(spec_key)
            if binder is None:
                binder = binders[spec_key] = CudaBinder(spec, cubin(spec), descriptors)
            runner = runners[key] = binder(plan, device, Slots(names))
        runner(list(tensors.values()), torch.cuda.current_stream(device))

    return launch
