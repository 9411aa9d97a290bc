"""One call of a kernel spec on the GPU outside the harness (NVRTC for this device, launched
through the harness's runner), and its error against an fp64 result: what the accuracy tests of
the 3xTF32 kernels measure beside PyTorch's own fp32."""

from __future__ import annotations

import torch

from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner
from kerngen.harness.spec import plan


def run_spec(spec, tensors: dict[str, torch.Tensor]) -> None:
    """Run every launch of ``spec`` once on ``tensors`` (inputs, parameters and outputs by name, on
    one device); its scratch buffers are allocated here."""
    device = next(iter(tensors.values())).device
    resolved = plan.resolve(spec, sizes={}, tensors={k: TensorFacts(tuple(v.shape)) for k, v in tensors.items()})
    bound = dict(tensors)
    for s in resolved.scratch:
        bound[s.name] = torch.empty(s.size, device=device, dtype=getattr(torch, s.dtype))
    major, minor = torch.cuda.get_device_capability(device)
    compiled = compile_job(job_for(spec, resolved, f"sm_{major}{minor}"), cache=None)
    module = LoadedModule(compiled.cubin, [launch.kernel for launch in resolved.launches])
    PlanRunner(module, resolved, bound, torch.cuda.current_stream(device))()
    torch.cuda.synchronize(device)


def fp64_errors(y: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(max |y - exact|, ||y - exact|| / ||exact||) against the fp64 result."""
    d = y.double() - exact
    return float(d.abs().max()), float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(exact))


def conv_fp64_errors(p, run) -> tuple[tuple[float, float], tuple[float, float]]:
    """The fp64 errors (:func:`fp64_errors`) of ``run(model, x)`` and of PyTorch's fp32 conv (TF32 off) on a
    conv2d problem ``p`` (its model holds ``conv``), seed 7: (ours, PyTorch's)."""
    model = p.build_model("cuda", 7)
    (x,) = p.make_inputs("cuda", 7)
    (torch32,) = p.run_reference(model, [x])  # cuDNN fp32, TF32 off (strict_fp32)
    conv = model.conv
    exact = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(), conv.stride, conv.padding)
    return fp64_errors(run(model, x), exact), fp64_errors(torch32, exact)
