"""The exported op's launch path without a GPU: every cache keyed by what it depends on (a new
pointer or shape builds again, the same one reuses), with the GPU work injected."""

from __future__ import annotations

import pytest
import torch

from kerngen.errors import SpecError
from kerngen.harness.gpu.op_call import KernelEntry, OpRuntime, signature
from kerngen.harness.gpu.op_runtime import (
    DescriptorCache, KernelRuntime, KeyedCache, MapBox, PlanCache, Slots, _bind_launch,
)
from kerngen.harness.spec.spec import KernelSpec
from tests.emu.runner import available as emu_available

SPEC = KernelSpec.model_validate({
    "source": 'extern "C" __global__ void k(const float* x, float* out, int n) {}',
    "tunables": {"BLOCK": [128, 256]},
    "constraints": ["x.shape[1] % 4 == 0"],
    "scratch": [{"name": "tmp", "size": "x.shape[0]"}],
    "steps": [{"kernel": "k", "grid": ["cdiv(x.numel, BLOCK)"], "block": ["BLOCK"],
               "args": [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.numel"}]},
              {"tensor": "tmp"}],
})


def shapes(rows: int, cols: int) -> tuple:
    return (("x", (rows, cols)), ("out", (rows, cols)))


def test_keyed_cache_builds_once_per_key_and_drops_the_least_recent():
    built = []
    cache = KeyedCache(lambda key, extra: built.append((key, extra)) or f"v{key}", capacity=2)
    assert cache.get(1, "a") == "v1" and cache.get(1, "b") == "v1" and cache.builds == 1
    cache.get(2, "a")
    cache.get(1, "a")  # 1 is now the most recent
    cache.get(3, "a")  # drops 2
    assert 1 in cache and 3 in cache and 2 not in cache and len(cache) == 2
    cache.get(2, "a")
    assert cache.builds == 4 and built[0] == (1, "a")


def test_plans_resolve_once_per_shape():
    plans = PlanCache(SPEC, {"BLOCK": 256}, {})
    p1 = plans.plan(shapes(8, 100))
    assert plans.plan(shapes(8, 100)) is p1 and plans.builds == 1
    p2 = plans.plan(shapes(16, 100))  # a new shape: resolved again, with its own grid and scratch
    assert plans.builds == 2 and p2.steps[0].grid == (7, 1, 1) and p2.scratch[0].size == 16
    assert p1.steps[0].grid == (4, 1, 1) and p1.steps[0].args[2].value == 800
    for _ in range(2):  # a shape the constraints refuse: refused every time, resolved once
        with pytest.raises(SpecError, match="constraint violated"):
            plans.plan(shapes(8, 102))
    assert plans.builds == 3


def test_a_seeded_plan_is_used_as_it_is():
    plans = PlanCache(SPEC, {"BLOCK": 256}, {})
    checked = plans.plan(shapes(8, 100)).model_copy(update={"defines": {"MARK": 1}})
    seeded = PlanCache(SPEC, {"BLOCK": 256}, {})
    seeded.seed(shapes(8, 100), checked)
    assert seeded.plan(shapes(8, 100)).defines == {"MARK": 1}


def test_runners_bind_once_per_shape_and_device():
    binds = []

    def bind(plan, device, slots):
        binds.append((plan.steps[0].grid, device, slots.names))
        return lambda tensors, stream: None

    kr = KernelRuntime(SPEC, {"BLOCK": 128}, {}, bind)
    slots = Slots(("x", "out", "tmp"))
    _, r1 = kr.runner(shapes(8, 100), 0, slots)
    _, r2 = kr.runner(shapes(8, 100), 0, slots)
    assert r1 is r2 and kr.binds == 1
    kr.runner(shapes(8, 100), 1, slots)  # another device: its own module and launches
    kr.runner(shapes(16, 100), 0, slots)
    assert kr.binds == 3 and [b[1] for b in binds] == [0, 1, 0] and binds[2][0] == (13, 1, 1)


class _T:
    """A tensor as the descriptor cache sees one: an address, a shape, a dtype."""

    def __init__(self, ptr: int, shape: tuple, dtype=torch.bfloat16) -> None:
        self.ptr, self.shape, self.dtype = ptr, shape, dtype

    def data_ptr(self) -> int:
        return self.ptr


class _Buf:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


BOX, SQUARE = MapBox(128, 64, 128), MapBox(64, 64, 128)


def test_descriptors_are_built_once_per_address_shape_and_box():
    made = []

    def build(tensor, box, capturing):
        made.append((tensor.ptr, tensor.shape, box.rows, capturing))
        return _Buf(0x1000 + 0x100 * len(made)), None

    cache = DescriptorCache(build, capacity=8)
    q = _T(0xA000, (8, 16, 4096, 128))
    first = cache.pointer(q, 0, BOX)
    assert cache.pointer(q, 0, BOX) == first and cache.builds == 1
    # the same address and shape from another tensor object (torch's allocator hands memory out again)
    assert cache.pointer(_T(0xA000, (8, 16, 4096, 128)), 0, BOX) == first and cache.builds == 1
    assert cache.pointer(_T(0xB000, (8, 16, 4096, 128)), 0, BOX) != first  # a new pointer
    cache.pointer(_T(0xA000, (8, 16, 2048, 128)), 0, BOX)  # a new shape at the same address
    cache.pointer(q, 0, SQUARE)  # another box
    cache.pointer(q, 1, BOX)  # another device
    cache.pointer(_T(0xA000, (8, 16, 4096, 128), torch.float16), 0, BOX)  # another dtype
    cache.pointer(q, 0, MapBox(128, 64, 128, full_width=False))  # one k tile per box
    cache.pointer(q, 0, MapBox(128, 64, 128, view=(8, 65536, 128)))  # the tensor seen as another shape
    assert cache.builds == 8 and not any(m[3] for m in made)


def test_descriptors_made_during_a_capture_are_kept_apart_and_never_dropped():
    made = []

    def build(tensor, box, capturing):
        made.append(capturing)
        return _Buf(len(made)), None

    cache = DescriptorCache(build, capacity=1)
    eager = cache.pointer(_T(1, (64, 64)), 0, SQUARE)
    # a hit while capturing uses the eager one (its bytes are already there)
    assert cache.pointer(_T(1, (64, 64)), 0, SQUARE, capturing=True) == eager and made == [False]
    captured = cache.pointer(_T(2, (64, 64)), 0, SQUARE, capturing=True)
    assert made == [False, True]
    for ptr in range(3, 6):  # eager misses push the eager entries out of a cache of one
        cache.pointer(_T(ptr, (64, 64)), 0, SQUARE)
    assert cache.pointer(_T(2, (64, 64)), 0, SQUARE, capturing=True) == captured  # still the graph's
    # an eager call at that address does not read the captured bytes (written only when the graph replays)
    assert cache.pointer(_T(2, (64, 64)), 0, SQUARE) != captured and made[-1] is False


def test_bound_launch_packs_scalars_and_leaves_pointer_slots():
    plan = PlanCache(SPEC, {"BLOCK": 256}, {}).plan(shapes(8, 100))
    kind, fn, grid, block, args, fills, maps, smem, coop = _bind_launch("fn", plan.steps[0], {"x": 0, "out": 1}, 0)
    assert (kind, fn, grid, block, smem, coop) == ("launch", "fn", (4, 1, 1), (256, 1, 1), 0, False)
    assert fills == ((0, 0), (1, 1)) and maps == () and int(args[2]) == 800 and args[2].dtype.name == "int32"
    with pytest.raises(SpecError, match="no tensor bound to 'out'"):
        _bind_launch("fn", plan.steps[0], {"x": 0}, 0)


def test_op_runtime_decides_once_per_signature():
    decided = []

    def admit(args):
        decided.append(signature(args))
        return lambda a: ("ran", a[0].shape)

    rt = OpRuntime(admit)
    x = torch.empty(8, 100)
    assert rt(x) == ("ran", (8, 100)) and rt(torch.empty(8, 100)) == ("ran", (8, 100))
    assert rt.entries == 1 and len(decided) == 1
    rt(torch.empty(16, 100))
    rt(torch.empty(8, 100, dtype=torch.float16))
    rt(torch.empty(8, 100, device="meta"))
    assert rt.entries == 4 and len(decided) == 4
    rt.replace((x,), lambda a: "replaced")
    assert rt(x) == "replaced" and len(decided) == 4
    rt.clear()
    rt(x)
    assert len(decided) == 5
    with pytest.raises(ValueError, match="argument 1 must be a tensor, got int"):
        rt(x, 3)


def test_an_entry_that_refuses_is_not_remembered():
    calls = []

    def admit(args):
        calls.append(1)
        raise ValueError("no kernel")

    rt = OpRuntime(admit)
    for _ in range(2):
        with pytest.raises(ValueError, match="no kernel"):
            rt(torch.empty(2))
    assert len(calls) == 2 and rt.entries == 0


def test_kernel_entry_allocates_outputs_and_scratch_per_call():
    seen = []
    entry = KernelEntry(lambda tensors, stream: seen.append(([tuple(t.shape) for t in tensors], stream)),
                        outputs=(((8, 4), torch.float32), ((8,), torch.int64)), scratch=((16, torch.float32),),
                        device=torch.device("cpu"))
    x = torch.empty(4, 8).t()  # not contiguous: made so before the kernel sees it
    a, b = entry((x,))
    assert a.shape == (8, 4) and b.dtype == torch.int64 and seen[0] == ([(8, 4), (8, 4), (8,), (16,)], None)
    a2, _ = entry((x,))
    assert a2.data_ptr() != a.data_ptr()  # a fresh output per call (the first one is still held)


@pytest.mark.skipif(not emu_available(), reason="no C++ compiler (g++) for the CPU emulator")
def test_the_descriptor_store_kernel_writes_its_16_words_in_order():
    """The kernel that writes a descriptor's 128 bytes from its parameters (an ordinary launch on a
    stream, one kernel node in a CUDA graph), run in the CPU emulator."""
    from kerngen.harness.compile.compiler import compile_job, job_for
    from kerngen.harness.gpu.op_runtime import STORE_KERNEL, STORE_SOURCE
    from kerngen.harness.spec.plan import resolve
    from kerngen.expr import TensorFacts
    from tests.emu.runner import emulate

    words = [(0x0123456789ABCDEF * (i + 1)) % 2**63 for i in range(16)]
    spec = KernelSpec.model_validate({"name": STORE_KERNEL, "source": STORE_SOURCE, "steps": [
        {"kernel": STORE_KERNEL, "grid": [1], "block": [1],
         "args": [{"name": "dst"}, *({"kind": "int64", "value": w} for w in words)]}]})
    dst = torch.zeros(16, dtype=torch.int64)
    emulate(spec, {"dst": dst})
    assert dst.tolist() == words
    plan = resolve(spec, sizes={}, tensors={"dst": TensorFacts((16,))})
    assert compile_job(job_for(spec, plan, "sm_90")).info.kernels[STORE_KERNEL].spill_stores == 0  # NVRTC takes it
