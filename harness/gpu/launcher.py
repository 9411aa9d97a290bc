"""Run a resolved launch plan: load the cubin with cupy, bind arguments by name, launch on the
harness's own stream. This is the only place candidate code reaches the GPU, and it is data:
a cubin plus numbers. No host code of the candidate exists to run.

A ``tensormap`` argument is bound to a TMA descriptor of its tensor that the harness builds
(:mod:`.tensormap`) in device memory, held by the runner for its lifetime; what the tensor does
not allow (its layout, dtype, alignment) is a :class:`SpecError` here, before any launch."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import numpy as np
import torch

from kerngen.errors import SpecError
from kerngen.harness.gpu import tensormap
from kerngen.harness.spec.plan import ResolvedLaunch, ResolvedMemset, ResolvedPlan

DEFAULT_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in to more dynamic shared memory
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH = 11

_SCALARS = {"int32": np.int32, "int64": np.int64, "float32": np.float32}


class LaunchRefused(RuntimeError):
    """A launch the harness will not make as declared (reported as a runtime error of the candidate)."""


def check_cooperative_fits(fn: Any, step: ResolvedLaunch) -> None:
    """A cooperative grid must be resident all at once. cupy would quietly shrink a grid that is
    not (with a warning); the harness runs the plan exactly as declared or refuses it."""
    import cupy

    threads = step.block[0] * step.block[1] * step.block[2]
    blocks = step.grid[0] * step.grid[1] * step.grid[2]
    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, threads, step.shared_mem)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    if blocks > per_sm * sms:
        raise LaunchRefused(
            f"cooperative launch of {step.kernel}: {blocks} blocks of {threads} threads, but at most "
            f"{per_sm * sms} can be resident at once ({sms} SMs x {per_sm})"
        )


def check_cluster(fn: Any, step: ResolvedLaunch) -> None:
    """A plan's cluster is the kernel's own ``__cluster_dims__`` (cupy launches through cuLaunchKernel, which takes
    it from the cubin): the two must agree, or the harness refuses the launch as declared."""
    import cupy

    width = max(1, cupy.cuda.driver.funcGetAttribute(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, fn.ptr))
    if width != step.cluster:
        raise LaunchRefused(f"launch of {step.kernel}: the plan says cluster {step.cluster}, the kernel declares "
                            f"__cluster_dims__ width {width}")


class Launcher(Protocol):
    """What runs a candidate's plan for the check and the timed runs: a cubin on the GPU
    (:class:`LoadedModule`), or the CPU emulator (:mod:`kerngen.harness.emu.launch`, for tests and
    ``kerngen check --emulate``). ``runner`` binds the plan to ``tensors`` once; each call of what
    it returns is one call of the candidate."""

    def runner(self, plan: ResolvedPlan, tensors: Mapping[str, torch.Tensor], stream: Any) -> Callable[[], None]: ...


class LoadedModule:
    """A cubin loaded into the current CUDA context, with its kernels looked up by name."""

    def __init__(self, cubin: bytes, kernels: list[str]) -> None:
        import cupy

        self.module = cupy.cuda.function.Module()
        self.module.load(cubin)
        self.functions = {name: self.module.get_function(name) for name in kernels}

    def runner(self, plan: ResolvedPlan, tensors: Mapping[str, torch.Tensor], stream: Any) -> "PlanRunner":
        return PlanRunner(self, plan, tensors, stream)

    def function(self, name: str, shared_mem: int) -> Any:
        import cupy

        fn = self.functions[name]
        if shared_mem > DEFAULT_SMEM_LIMIT:
            # cupy 14's Function has no setter for this: go through the driver API
            cupy.cuda.driver.funcSetAttribute(fn.ptr, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem)
        return fn


class PlanRunner:
    """One call of the candidate: every step of the plan, in order, on ``stream``.

    Arguments are bound once (pointers are stable for the runner's lifetime), so a call costs
    only the launches themselves. The runner holds the tensors it was given for as long as it lives:
    its launches hold their addresses, and a buffer freed under a live runner is memory the caching
    allocator hands to the next tensor (op_bench's runners, one per input set, each with scratch made
    for it in a loop, wrote into the exported op's outputs and TMA descriptors: "the op's output
    differs" and illegal instructions in ``kerngen suite``, H200, 2026-11-28)."""

    def __init__(
        self,
        module: LoadedModule,
        plan: ResolvedPlan,
        tensors: Mapping[str, torch.Tensor],
        stream: torch.cuda.Stream,
    ) -> None:
        import cupy

        self.stream = stream
        self._cupy_stream = cupy.cuda.ExternalStream(stream.cuda_stream)
        self._held = dict(tensors)  # kept alive: the launches below hold their addresses
        self._calls: list[tuple] = []
        self._tensormaps: list[torch.Tensor] = []  # device memory the kernels' tensormap pointers point into
        # the attribute is the kernel's, not the launch's: opted into the largest need of any of its launches
        # (a later, smaller launch of the same kernel must not take back what an earlier one needs)
        self._smem: dict[str, int] = {}
        for step in plan.launches:
            self._smem[step.kernel] = max(self._smem.get(step.kernel, 0), step.shared_mem)
        for index, step in enumerate(plan.steps):
            if isinstance(step, ResolvedMemset):
                t = tensors[step.tensor]
                self._calls.append(("memset", t.data_ptr(), step.value, t.numel() * t.element_size()))
            else:
                self._calls.append(self._bind_launch(module, step, tensors, index))

    def _bind_launch(
        self, module: LoadedModule, step: ResolvedLaunch, tensors: Mapping[str, torch.Tensor], index: int = 0
    ) -> tuple:
        args: list[Any] = []
        for pos, arg in enumerate(step.args):
            if arg.kind in ("tensor", "tensormap"):
                if arg.name not in tensors:
                    raise SpecError(f"kernel {step.kernel}: no tensor bound to {arg.name!r}")
                if arg.kind == "tensor":
                    args.append(np.uint64(tensors[arg.name].data_ptr()))
                else:
                    args.append(np.uint64(self._tensormap(step, tensors[arg.name], arg, index, pos)))
            else:
                args.append(_SCALARS[arg.kind](arg.value))
        fn = module.function(step.kernel, self._smem.get(step.kernel, step.shared_mem))
        if step.cooperative:
            check_cooperative_fits(fn, step)
        if step.cluster > 1:
            check_cluster(fn, step)
        return ("launch", fn, step.grid, step.block, tuple(args), step.shared_mem, step.cooperative)

    def _tensormap(self, step: ResolvedLaunch, tensor: torch.Tensor, arg: Any, index: int, pos: int) -> int:
        """The device address of a TMA descriptor of ``tensor`` for ``arg`` (kept by the runner)."""
        assert arg.box is not None and arg.swizzle is not None
        what = f"step {index}: kernel '{step.kernel}' argument {pos}: tensormap of '{arg.name}'"
        box_rows, box_cols = arg.box
        buf = tensormap.device_map(tensor, box_rows, box_cols, arg.swizzle, what, full_width=arg.full_width,
                                   view=arg.view)
        self._tensormaps.append(buf)
        return buf.data_ptr()

    def __call__(self) -> None:
        import cupy

        for call in self._calls:
            if call[0] == "memset":
                _, ptr, value, nbytes = call
                cupy.cuda.runtime.memsetAsync(ptr, value, nbytes, self._cupy_stream.ptr)
            else:
                _, fn, grid, block, args, smem, coop = call
                # the grid was checked to be resident at once (check_cooperative_fits)
                fn(grid, block, args, shared_mem=smem, stream=self._cupy_stream, enable_cooperative_groups=coop)
