"""For the device scripts (i33.sh, i33b.sh): the kernel of a loaded export (``kerngen.load``) through the harness's
own launcher, on buffers bound once, as a run times it: the loaded op timed beside it isolates the op path's cost."""

from __future__ import annotations

from typing import Any

import torch

from kerngen.harness.compile.nvrtc_info import arch_for_capability
from kerngen.harness.gpu.buffers import torch_dtype
from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner


def direct_runner(fn: Any, args: list[torch.Tensor]) -> tuple[PlanRunner, dict[str, torch.Tensor], Any]:
    """The runner of ``fn``'s first kernel on ``args`` (its outputs and scratch made here), the tensors it is bound
    to by name, and the kernel's variant record."""
    v = fn.kerngen.variants[0]
    cubin = fn.kerngen.cubin_for(arch_for_capability(*torch.cuda.get_device_capability()), v)
    held = {t.name: a for t, a in zip(v.arguments, args)}
    held |= {t.name: torch.empty(tuple(t.shape), dtype=torch_dtype(t.dtype), device="cuda") for t in v.outputs}
    held |= {s.name: torch.empty((s.size,), dtype=torch_dtype(s.dtype), device="cuda") for s in v.plan.scratch}
    runner = PlanRunner(LoadedModule(cubin, sorted({s.kernel for s in v.plan.launches})), v.plan, held,
                        torch.cuda.current_stream())
    return runner, held, v
