"""The host's time per call of an exported op, layer by layer (issue 33).

    python scripts/op_host_cost.py                  # on any machine: the CUDA leaves faked, CPU tensors
    python scripts/op_host_cost.py --device cuda    # on a GPU host: real cupy launches on torch's stream
    python scripts/op_host_cost.py --profile        # and cProfile's top entries of the whole op call

Each layer wraps the one above it, so the difference of two rows is what that layer adds:

  leaf      the launch function alone (cpu: a Python function with cupy's signature that does nothing;
            cuda: the real cupy launch of the kernel, with the arguments built once)
  runner    the bound plan (:class:`op_runtime._CudaRunner`): pointers read, launches looked up and made
  entry     :class:`op_call.KernelEntry`: layout checks, outputs and scratch from torch.empty, the stream
  runtime   :class:`op_call.OpRuntime`: the arguments' signature and its entry looked up
  op        through torch's dispatcher, as ``kerngen.load`` registers the op (:func:`op_call.register_op`)

and, for comparison, the dispatch alone of a trivial implementation (one torch.empty) registered with
``torch.library.custom_op`` and with ``torch.library.Library`` (what register_op uses now).

Kernels: ``softmax_ok`` (one launch) and ``softmax_multi_launch`` (three launches, a memset, two
scratch buffers) of tests/kernels/specs.py at 8x100; on the CPU also ``softmax_tma``: softmax_ok with
its input passed as a TMA descriptor (the descriptor's builder faked), as the attention kernel takes three.
Microseconds per call: the fastest of 10 rounds of --calls / 10 calls. The script also runs against an older
tree whose runner imports cupy per call (a stand-in cupy module is installed for the CPU run).
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import pstats
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kerngen.harness.gpu import op_runtime  # noqa: E402
from kerngen.harness.gpu.op_call import KernelEntry, OpRuntime, register_op  # noqa: E402
from kerngen.harness.gpu.op_runtime import DescriptorCache, Slots, _bind_launch, _CudaRunner  # noqa: E402
from kerngen.harness.spec.plan import resolve  # noqa: E402
from kerngen.expr import TensorFacts  # noqa: E402
from kerngen.harness.spec.spec import KernelSpec  # noqa: E402
from tests.kernels.specs import CASES  # noqa: E402

SHAPE = (8, 100)
NEW_RUNNER = "stream_of" in inspect.signature(_CudaRunner).parameters  # this tree's runner (else an older one)


class _FakeStream:
    """What a runner is given as torch's stream, and what cupy's ExternalStream gives it (``ptr``)."""

    def __init__(self, handle: int = 7, device: int = 0) -> None:
        self.cuda_stream = self.ptr = handle


def _fake_launch(grid, block, args, shared_mem=0, stream=None, enable_cooperative_groups=False):
    return None


def _fake_memset(ptr, value, nbytes, stream):
    return None


def _stub_cupy() -> None:
    """An older runner imports cupy on every call: a stand-in module (no GPU here to launch on)."""
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(ExternalStream=_FakeStream, runtime=types.SimpleNamespace(memsetAsync=_fake_memset))
    sys.modules["cupy"] = cupy


def _tma_spec() -> KernelSpec:
    data = CASES["softmax_ok"].spec.model_dump(mode="json", exclude_none=True)
    data["name"] = "softmax_tma"
    step = data["steps"][0]
    step["args"][0] = {"kind": "tensormap", "name": "x", "box_rows": 1, "box_cols": SHAPE[1], "swizzle": 0}
    return KernelSpec.model_validate(data)


def _plan(spec: KernelSpec):
    config = {name: values[0] if name != "BLOCK" else 128 for name, values in spec.tunables.items()}
    return resolve(spec, sizes={}, tensors={"x": TensorFacts(SHAPE), "out": TensorFacts(SHAPE)}, config=config)


class _FakeBuffer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def _cpu_runner(spec: KernelSpec):
    """(runner, the stream to call it with, plan, slots) with fake CUDA leaves."""
    plan = _plan(spec)
    slots = Slots(("x", "out", *(s.name for s in plan.scratch)))
    index = slots.index()
    steps = [("memset", index[s.tensor], s.value) if not hasattr(s, "kernel") else _bind_launch(_fake_launch, s, index, n)
             for n, s in enumerate(plan.steps)]
    descriptors = DescriptorCache(lambda tensor, box, capturing: (_FakeBuffer(0xD000 + tensor.data_ptr() % 4096), None))
    if NEW_RUNNER:
        runner = _CudaRunner(steps, 0, descriptors, stream_of=_FakeStream, memset=_fake_memset, capturing=lambda: False,
                             pack=lambda value: value)
        return runner, 7, plan, slots
    _stub_cupy()
    torch.cuda.is_current_stream_capturing = lambda: False  # an older runner asks on every call where it has maps
    return _CudaRunner(steps, 0, descriptors), _FakeStream(), plan, slots


def _cuda_runner(spec: KernelSpec):
    from kerngen.harness.compile.compiler import compile_job, job_for
    from kerngen.harness.compile.nvrtc_info import arch_for_capability

    plan = _plan(spec)
    arch = arch_for_capability(*torch.cuda.get_device_capability(0))
    cubin = compile_job(job_for(spec, plan, arch)).cubin
    slots = Slots(("x", "out", *(s.name for s in plan.scratch)))
    binder = op_runtime.CudaBinder(spec, lambda _plan, _dev: cubin, DescriptorCache(op_runtime.write_descriptor))
    stream = torch.cuda.current_stream(0)
    return binder(plan, 0, slots), (stream.cuda_stream if NEW_RUNNER else stream), plan, slots


def timed(call, calls: int, sync) -> float:
    """Microseconds per call: the fastest of 10 rounds of calls / 10 (a shared machine's other work
    lengthens some rounds, never shortens one)."""
    for _ in range(min(calls, 500)):
        call()
    sync()
    per_round = max(1, calls // 10)
    best = float("inf")
    for _ in range(10):
        began = time.perf_counter()
        for _ in range(per_round):
            call()
        sync()
        best = min(best, (time.perf_counter() - began) / per_round * 1e6)
    return best


def layers(name: str, spec: KernelSpec, device: str, calls: int, profile: bool) -> list[tuple[str, float]]:
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    runner, stream, plan, slots = (_cuda_runner if cuda else _cpu_runner)(spec)
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    x = torch.randn(SHAPE, device=dev)
    outputs = ((SHAPE, torch.float32),)
    scratch = tuple((s.size, torch.float32) for s in plan.scratch)
    held = [x, torch.empty(SHAPE, device=dev), *(torch.empty((n,), device=dev) for n, _ in scratch)]
    rows = []
    launches = [s for s in runner.steps if s[0] == "launch"]
    if cuda:
        import cupy

        cs = cupy.cuda.ExternalStream(torch.cuda.current_stream(0).cuda_stream, 0)
        runner(held, stream)  # makes its launch set for these addresses: the leaf launches exactly those
        made = (runner._prepared[tuple(t.data_ptr() for t in held)][0] if NEW_RUNNER else
                [(s[1], s[2], s[3], tuple(_filled(s, held)), s[7], s[8]) for s in launches])

        def leaf():
            for fn, grid, block, args, smem, _coop in made:
                if fn is not None:  # memsets are not launches
                    fn(grid, block, args, smem, cs)
    else:
        def leaf():
            for s in launches:
                _fake_launch(s[2], s[3], s[4], shared_mem=s[7], stream=None)
    rows.append(("leaf (the launches alone)", timed(leaf, calls, sync)))
    rows.append(("runner", timed(lambda: runner(held, stream), calls, sync)))
    if cuda:
        bound_runner = runner
    else:  # KernelEntry gives a CPU backend's runner no stream: this one wants the fake one
        def bound_runner(tensors, _stream):
            runner(tensors, stream)
    entry = KernelEntry(bound_runner, outputs, scratch, dev)
    rows.append(("entry", timed(lambda: entry((x,)), calls, sync)))
    rt = OpRuntime(lambda args: entry)
    rows.append(("runtime", timed(lambda: rt(x), calls, sync)))
    op = register_op(f"kerngen_host_cost::{name}", "(Tensor x) -> Tensor", rt, lambda a: torch.empty_like(a))
    rows.append(("op (torch dispatch)", timed(lambda: op(x), calls, sync)))
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            op(x)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
        print(f"--- cProfile of {calls} op calls ({name}) ---\n" + "\n".join(text.getvalue().splitlines()[4:24]))
    return rows


def _filled(step: tuple, held: list) -> list:
    import numpy as np

    args = list(step[4])
    for pos, slot in step[5]:
        args[pos] = np.uint64(held[slot].data_ptr())
    return args


def dispatch_only(device: str, calls: int) -> list[tuple[str, float]]:
    """A trivial implementation (one torch.empty) behind each way of registering an op."""
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.randn(SHAPE, device=dev)

    def impl(a):
        return torch.empty(SHAPE, dtype=a.dtype, device=a.device)

    custom = torch.library.custom_op("kerngen_host_cost::custom", impl, mutates_args=(), schema="(Tensor x) -> Tensor")
    custom.register_fake(lambda a: torch.empty_like(a))
    lib = register_op("kerngen_host_cost::lib", "(Tensor x) -> Tensor", impl, lambda a: torch.empty_like(a))
    return [("impl alone (one torch.empty)", timed(lambda: impl(x), calls, sync)),
            ("torch.library.custom_op", timed(lambda: custom(x), calls, sync)),
            (f"register_op ({'torch.library.Library' if NEW_RUNNER else 'custom_op: an older tree'})", timed(lambda: lib(x), calls, sync))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true")
    a = parser.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device")
    kernels = {"softmax_ok": CASES["softmax_ok"].spec, "softmax_multi_launch": CASES["softmax_multi_launch"].spec}
    if a.device == "cpu":
        kernels["softmax_tma"] = _tma_spec()
    table = {name: layers(name, spec, a.device, a.calls, a.profile) for name, spec in kernels.items()}
    where = torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU, CUDA leaves faked"
    print(f"host us per call, {where}, torch {torch.__version__}, {a.calls} calls, fastest of 10 rounds"
          f"{'' if NEW_RUNNER else ' (an older tree: its runner)'}")
    names = list(table)
    print("layer".ljust(32) + "".join(n.rjust(22) for n in names))
    for i, (label, _) in enumerate(table[names[0]]):
        print(label.ljust(32) + "".join(f"{table[n][i][1]:22.2f}" for n in names))
    print("dispatch alone:")
    for label, us in dispatch_only(a.device, a.calls):
        print(f"  {label:40s} {us:8.2f}")


if __name__ == "__main__":
    main()
