"""CPU tier of the Hopper features of a spec: ``arch_specific`` (sm_90a with real NVRTC) and the
``tensormap`` launch argument (schema, plan resolution, the map's layout and refusals, the
encode call with a fake driver, argument sizes, ``kerngen check``). The GPU tier runs the TMA
kernel: tests/harness/test_gpu_tensormap.py."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from kerngen.errors import CompileError, SpecError
from kerngen.expr import TensorFacts
from kerngen.harness.compile.cache import CompileCache
from kerngen.harness.compile.compiler import compile_job, job_for, target_arch
from kerngen.harness.gpu import tensormap
from kerngen.harness.gpu.tensormap import TensorMapLayout, check_plan, layout, layout_for
from kerngen.harness.spec.kparams import KernelParam, arg_bytes, check_launch_args, launch_problems
from kerngen.harness.spec.plan import ResolvedPlan, resolve
from kerngen.harness.spec.spec import KernelSpec, ScalarArg, TensorArg, TensorMapArg
from tests.kernels.tma import CASES, negate_spec, tile_spec

PROBLEM = "tests/data/tma_problems/neg_bf16.py"
X = (2, 3, 100, 128)
WGMMA = 'extern "C" __global__ void k(float* x) { asm volatile("wgmma.fence.sync.aligned;"); x[threadIdx.x] = 1.0f; }'


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))


def _spec(args: list, **extra) -> dict:
    return {"source": 'extern "C" __global__ void k(const void* m, float* out) {}', **extra,
            "steps": [{"kernel": "k", "grid": [1], "block": [128], "args": args}]}


def _map(**over) -> dict:
    return {"kind": "tensormap", "name": "x", "box_rows": 64, "box_cols": 64, **over}


# ----- the schema ----------------------------------------------------------------------------------
def test_tensormap_arg_parses_beside_tensor_and_scalar_args():
    text = json.dumps(_spec([_map(box_rows="BR", swizzle=64), {"name": "out"}, {"kind": "int32", "value": 3}]))
    spec = KernelSpec.from_text(text)
    tmap, out, n = spec.steps[0].args
    assert isinstance(tmap, TensorMapArg) and isinstance(out, TensorArg) and isinstance(n, ScalarArg)
    assert (tmap.name, tmap.box_rows, tmap.box_cols, tmap.swizzle) == ("x", "BR", 64, 64)
    assert KernelSpec.from_text(json.dumps(_spec([_map()]))).steps[0].args[0].swizzle == 128  # the default
    assert KernelSpec.model_validate(spec.model_dump()) == spec  # a dump reads back (runs, exports)
    assert '"tensormap"' in KernelSpec.schema_json() and "arch_specific" in KernelSpec.schema_json()


@pytest.mark.parametrize("arg,match", [
    (_map(swizzle=16), r"args\.0\.tensormap\.swizzle: Input should be 0, 32, 64 or 128"),
    (_map(swizzle="128"), r"tensormap\.swizzle: Input should be 0, 32, 64 or 128"),
    (_map(swizzle=False), r"tensormap\.swizzle: swizzle must be 0, 32, 64 or 128 \(bytes\), got False"),
    ({"kind": "tensormap", "name": "x", "box_cols": 64}, r"tensormap\.box_rows: Field required"),
    (_map(value=3), r"tensormap\.value: Extra inputs are not permitted"),
    (_map(box_cols="64 +"), r"steps\.0\.args\.0\.box_cols: cannot parse expression"),
    (_map(box_rows=2**70), r"steps\.0\.args\.0\.box_rows: the integer .* does not fit 64 bits"),
    (_map(name="x[0]"), r"tensormap\.name: String should match pattern"),
    ({"kind": ["tensormap"], "name": "x"}, r"scalar\.kind: Input should be 'int32', 'int64' or 'float32'"),
])
def test_bad_tensormap_args_are_one_line_spec_errors(arg, match):
    with pytest.raises(SpecError, match=match) as info:
        KernelSpec.from_text(json.dumps(_spec([arg])))
    assert "\n" not in str(info.value)


def test_arch_specific_defaults_off_and_keeps_old_hashes():
    plain = KernelSpec.model_validate(_spec([{"name": "x"}]))
    assert plain.arch_specific is False
    assert KernelSpec.model_validate(_spec([{"name": "x"}], arch_specific=False)).content_hash() == plain.content_hash()
    specific = KernelSpec.model_validate(_spec([{"name": "x"}], arch_specific=True))
    assert specific.content_hash() != plain.content_hash()
    assert "arch_specific" not in json.dumps(plain.model_dump(mode="json", exclude={"arch_specific"}))


# ----- plan resolution -----------------------------------------------------------------------------
def _resolve(args: list, tensors=None, **extra) -> ResolvedPlan:
    spec = KernelSpec.model_validate(_spec(args, **extra))
    return resolve(spec, sizes={"D": 128}, tensors=tensors or {"x": TensorFacts(X), "out": TensorFacts(X)})


def test_plan_evaluates_the_box_expressions():
    plan = _resolve([_map(box_rows="BR * 2", box_cols="x.shape[3] // 2", swizzle=0), {"name": "out"}],
                    tunables={"BR": [32, 64]}, defaults={"BR": 64})
    arg = plan.launches[0].args[0]
    assert (arg.kind, arg.name, arg.box, arg.swizzle, arg.value) == ("tensormap", "x", (128, 64), 0, None)
    assert ResolvedPlan.model_validate_json(plan.model_dump_json()) == plan  # crosses to the GPU worker


@pytest.mark.parametrize("over,match", [
    ({"box_rows": 0}, r"step 0: kernel 'k' argument 0: tensormap box_rows 0 is not in 1\.\.256"),
    ({"box_rows": 257}, r"tensormap box_rows 257 is not in 1\.\.256"),
    ({"box_cols": "D * 4"}, r"tensormap box_cols 'D \* 4' = 512 is not in 1\.\.256"),
    ({"box_cols": "D / 3"}, r"expected an integer"),
    ({"name": "y"}, r"argument 0: unknown tensor 'y'"),
])
def test_plan_refuses_a_box_out_of_range_and_unknown_tensors(over, match):
    with pytest.raises(SpecError, match=match):
        _resolve([_map(**over)])


# ----- the map's layout (pure Python) -----------------------------------------------------------------
def test_layout_of_an_attention_tensor():
    lay = layout((8, 16, 4096, 128), "bfloat16", 128, 64, 128)
    assert lay == TensorMapLayout(dtype="bfloat16", element_bytes=2, dims=(64, 4096, 2, 128),
                                  strides=(256, 128, 1048576), box=(64, 128, 2, 1), swizzle=128)
    assert lay.box_bytes == 128 * 128 * 2


def test_layout_of_a_2d_fp32_and_a_3d_fp16_tensor():
    lay = layout((100, 64), "float32", 16, 32, 128)
    assert (lay.dims, lay.strides, lay.box, lay.box_bytes) == ((32, 100, 2, 1), (256, 128, 25600), (32, 16, 2, 1),
                                                               16 * 64 * 4)
    lay = layout((5, 7, 48), "float16", 7, 8, 0)
    assert (lay.dims, lay.strides, lay.box) == ((8, 7, 6, 5), (96, 16, 672), (8, 7, 6, 1))


@pytest.mark.parametrize("shape,dtype,box,swizzle,extra,match", [
    (X, "bfloat16", (64, 64), 128, {"contiguous": False}, "the tensor is not contiguous"),
    ((128,), "bfloat16", (64, 64), 128, {}, r"the tensor has 1 dim \(128,\); a tensormap needs 2 or more"),
    (X, "int32", (64, 64), 128, {}, "dtype int32 is not supported"),
    (X, "float64", (64, 16), 128, {}, "dtype float64 is not supported"),
    (X, "bfloat16", (64, 48), 128, {}, r"cols 128 \(shape\[-1\]\) is not a multiple of box_cols 48"),
    ((4, 8 * 257), "float32", (4, 8), 0, {}, "cols / box_cols = 2056 / 8 = 257 slabs; at most 256"),
    ((4, 100), "bfloat16", (4, 50), 0, {}, "a row of cols 100 x 2 bytes = 200 bytes is not a multiple of 16"),
    ((4, 64), "bfloat16", (4, 4), 0, {}, "box_cols 4 x 2 bytes = 8 bytes is not a multiple of 16"),
    ((4, 256), "bfloat16", (4, 128), 128, {}, r"256 bytes is more than the swizzle of 128 bytes \(box_cols <= 64\)"),
    ((4, 256), "float32", (4, 32), 64, {}, "128 bytes is more than the swizzle of 64 bytes"),
    ((4, 256), "float16", (4, 32), 32, {}, "64 bytes is more than the swizzle of 32 bytes"),
    (X, "bfloat16", (64, 64), 128, {"data_ptr": 1024 + 8}, "address is not 16-byte aligned"),
    ((2**32, 64), "bfloat16", (64, 64), 128, {}, "dim rows = 4294967296 is 2\\*\\*32 or more"),
    ((2**16, 2**16, 1, 64), "bfloat16", (1, 64), 128, {}, "dim outer = 4294967296 is 2\\*\\*32 or more"),
    ((2**31, 256), "bfloat16", (64, 64), 128, {}, "2\\*\\*40 bytes or more"),
    ((0, 64), "bfloat16", (64, 64), 128, {}, r"the tensor \(0, 64\) is empty"),
    (X, "bfloat16", (0, 64), 128, {}, r"box_rows 0 is not in 1\.\.256"),
    (X, "bfloat16", (64, 300), 128, {}, r"box_cols 300 is not in 1\.\.256"),
    (X, "bfloat16", (64, 64), 16, {}, "swizzle 16 is not 0, 32, 64 or 128"),
])
def test_layout_refusals_are_one_line_spec_errors(shape, dtype, box, swizzle, extra, match):
    with pytest.raises(SpecError, match=match) as info:
        layout(shape, dtype, box[0], box[1], swizzle, what="step 0: kernel 'k' argument 0: tensormap of 'x'", **extra)
    assert str(info.value).startswith("step 0: kernel 'k' argument 0: tensormap of 'x': ")
    assert "\n" not in str(info.value)


def test_layout_for_a_torch_tensor():
    x = torch.zeros(X, dtype=torch.bfloat16)
    assert layout_for(x, 64, 64, 128).dims == (64, 100, 2, 6)
    with pytest.raises(SpecError, match="not contiguous"):
        layout_for(x.transpose(2, 3), 64, 64, 128)
    with pytest.raises(SpecError, match="dtype int32 is not supported"):
        layout_for(torch.zeros(X, dtype=torch.int32), 64, 64, 128)
    shifted = torch.zeros(1 + x.numel(), dtype=torch.bfloat16)[1:].view(X)  # contiguous, 2 bytes past 16
    with pytest.raises(SpecError, match="not 16-byte aligned"):
        layout_for(shifted, 64, 64, 128)


def test_check_plan_reads_shapes_and_dtypes():
    plan = _resolve([_map(), {"name": "out"}])
    check_plan(plan, {"x": (X, "bfloat16")})
    check_plan(plan, {})  # a name it does not know: the launcher's to report
    with pytest.raises(SpecError, match="step 0: kernel 'k' argument 0: tensormap of 'x': dtype float64"):
        check_plan(plan, {"x": (X, "float64")})


# ----- the encode call, with a fake driver -------------------------------------------------------------
@pytest.fixture
def fake_driver(monkeypatch):
    from cuda.bindings import driver as cu

    calls: list[tuple] = []
    result = {"err": cu.CUresult.CUDA_SUCCESS}

    def encode(*args):
        calls.append(args)
        tmap = cu.CUtensorMap()
        tmap.opaque = [cu.cuuint64_t(0x0101010101010101 * (i + 1)) for i in range(16)]
        return result["err"], tmap

    monkeypatch.setattr(cu, "cuInit", lambda flags: (cu.CUresult.CUDA_SUCCESS,))
    monkeypatch.setattr(cu, "cuTensorMapEncodeTiled", encode)
    return cu, calls, result


def test_encode_passes_the_layout_and_returns_the_128_bytes(fake_driver):
    cu, calls, _ = fake_driver
    lay = layout((8, 16, 4096, 128), "bfloat16", 128, 64, 128)
    data = tensormap.encode(lay, 1 << 20)
    assert data == struct.pack("<16Q", *(0x0101010101010101 * (i + 1) for i in range(16)))
    (args,) = calls
    dtype, rank, address, dims, strides, box, elem, interleave, swizzle, l2, oob = args
    assert dtype == cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 and rank == 4 and address == 1 << 20
    assert all(isinstance(d, cu.cuuint64_t) for d in dims + strides)
    assert all(isinstance(b, cu.cuuint32_t) for b in box + elem)
    assert [int(d) for d in dims] == [64, 4096, 2, 128] and [int(s) for s in strides] == [256, 128, 1048576]
    assert [int(b) for b in box] == [64, 128, 2, 1] and [int(e) for e in elem] == [1, 1, 1, 1]
    assert interleave == cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert swizzle == cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    assert l2 == cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B
    assert oob == cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
    for bytes_, name in ((0, "NONE"), (32, "32B"), (64, "64B")):
        tensormap.encode(layout((4, 256), "float32", 4, bytes_ // 4 or 8, bytes_), 1 << 20)
        assert calls[-1][0] == cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32
        assert calls[-1][8] == getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{name}")


def test_a_failing_encode_names_its_cuda_result(fake_driver):
    cu, _, result = fake_driver
    result["err"] = cu.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(SpecError, match=r"^tensormap of 'x': cuTensorMapEncodeTiled failed with "
                                        r"CUDA_ERROR_INVALID_VALUE \(dims \(64, 100, 2, 6\)"):
        tensormap.encode(layout(X, "bfloat16", 64, 64), 1 << 20, what="tensormap of 'x'")


def test_device_map_is_an_aligned_copy_of_the_map(fake_driver):
    x = torch.zeros(X, dtype=torch.bfloat16)
    view = tensormap.device_map(x, 64, 64, 128)
    assert view.dtype == torch.uint8 and view.numel() == 128 and view.device == x.device
    assert view.data_ptr() % 64 == 0
    assert bytes(view.tolist()) == struct.pack("<16Q", *(0x0101010101010101 * (i + 1) for i in range(16)))
    with pytest.raises(SpecError, match="not contiguous"):
        tensormap.device_map(x.transpose(0, 1), 64, 64, 128)


def test_encode_hands_the_real_binding_the_types_it_takes(monkeypatch):
    """Without a driver library the binding fails only after it converted every argument."""
    from cuda.bindings import driver as cu

    monkeypatch.setattr(cu, "cuInit", lambda flags: (cu.CUresult.CUDA_SUCCESS,))
    try:
        data = tensormap.encode(layout(X, "bfloat16", 64, 64), 1 << 20)
    except (TypeError, ValueError, OverflowError, AttributeError) as exc:
        pytest.fail(f"the binding refused an argument: {type(exc).__name__}: {exc}")
    except RuntimeError as exc:  # no CUDA driver library on this machine: past the conversions
        assert type(exc).__name__ == "DynamicLibNotFoundError" and "driver" in str(exc), exc
        return
    assert len(data) == 128  # a machine with a driver encodes it


# ----- kernel parameters -----------------------------------------------------------------------------
def test_a_tensormap_argument_is_a_pointer():
    assert arg_bytes("tensormap") == 8
    launch = _resolve([_map(), {"name": "out"}]).launches[0]
    assert launch_problems(launch, [KernelParam(0, 0, 8), KernelParam(1, 8, 8)], 0) == []
    (problem,) = launch_problems(launch, [KernelParam(0, 0, 128), KernelParam(1, 128, 8)], 0)
    assert "tensormap of 'x' (8 bytes) given for parameter 0 of 128 bytes" in problem
    assert "declare the parameter const void*" in problem


# ----- arch_specific: sm_90a with NVRTC --------------------------------------------------------------
@pytest.mark.parametrize("arch,specific,target", [
    ("sm_90", True, "sm_90a"), ("sm_100", True, "sm_100a"), ("sm_120", True, "sm_120a"),
    ("sm_90a", True, "sm_90a"), ("sm_100f", True, "sm_100f"), ("sm_89", True, "sm_89"), ("sm_80", True, "sm_80"),
    ("sm_90", False, "sm_90"),
])
def test_target_arch(arch, specific, target):
    spec = KernelSpec.model_validate(_spec([{"name": "x"}], arch_specific=specific))
    assert target_arch(spec, arch) == target


def _wgmma_job(specific: bool, arch: str = "sm_90"):
    spec = KernelSpec.model_validate({"source": WGMMA, "arch_specific": specific,
                                      "steps": [{"kernel": "k", "grid": [1], "block": [128], "args": [{"name": "x"}]}]})
    return job_for(spec, resolve(spec, sizes={}, tensors={"x": TensorFacts((128,))}), arch)


def test_arch_specific_compiles_wgmma_for_sm_90a():
    job = _wgmma_job(True)
    assert job.arch == "sm_90a" and job.options[0] == "--gpu-architecture=sm_90a"
    assert sum(o.startswith("--gpu-architecture") for o in job.options) == 1
    out = compile_job(job, cache=None)
    assert out.info.arch == "sm_90a" and "for 'sm_90a'" in out.info.log
    assert set(out.info.kernels) == {"k"} and out.info.kernels["k"].registers > 0  # the ptxas report parsed
    assert CompileCache.key_for(job) != CompileCache.key_for(_wgmma_job(False))


def test_without_arch_specific_wgmma_is_a_compile_error():
    job = _wgmma_job(False)
    assert job.arch == "sm_90"
    with pytest.raises(CompileError, match=r"wgmma.*sm_90"):
        compile_job(job, cache=None)
    with pytest.raises(CompileError, match=r"wgmma.*sm_80"):  # below sm_90 the spec is compiled as it is
        compile_job(_wgmma_job(True, "sm_80"), cache=None)


# ----- the TMA kernel of the GPU tier, compiled here ----------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=[f"{r}x{c}_sw{s}" for r, c, s in CASES])
def test_the_tma_kernel_compiles_for_sm_90a_with_matching_arguments(case):
    box_rows = case[0]
    tiles = -(-X[2] // box_rows)
    spec = tile_spec(*case)
    plan = resolve(spec, sizes={}, tensors={"x": TensorFacts(X), "out": TensorFacts((6, tiles * box_rows, 128))})
    launch = plan.launches[0]
    assert launch.grid == (tiles, 6, 1) and launch.shared_mem == box_rows * 128 * 2 + 1024
    out = compile_job(job_for(spec, plan, "sm_90"), cache=None)
    assert out.info.arch == "sm_90a"
    check_launch_args(out.cubin, plan, out.info.log)  # a pointer for the map, the output, two ints


def test_kerngen_check_shows_and_checks_tensormap_arguments(tmp_path):
    from kerngen.cli.check import run_check

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    negate_spec().dump(good)
    negate_spec(64, 48, 128).dump(bad)
    report = run_check(str(good), PROBLEM, arch="sm_90")
    assert report["ok"], report["error"]
    assert report["compile"]["arch"] == "sm_90a" and "--gpu-architecture=sm_90a" in report["compile"]["options"]
    assert report["plan"]["steps"][0]["args"][0] == {"kind": "tensormap", "bytes": 8, "name": "x", "box": [64, 64],
                                                     "swizzle": 128}
    report = run_check(str(bad), PROBLEM, arch="sm_90a")
    assert not report["ok"] and report["stage"] == "plan"
    assert report["error"] == ("step 0: kernel 'tma_rows' argument 0: tensormap of 'x': cols 128 (shape[-1]) is not "
                               "a multiple of box_cols 48")


# ----- one k tile a box (full_width false) and a view: the GEMM core's maps (issue 35) ---------------------
def test_k_tile_maps_and_views_parse_resolve_and_dump_compactly():
    arg = _map(full_width=False, view=["2 * x.shape[0]", "x.shape[1] * x.shape[2]", "x.shape[3]"], box_cols=64)
    spec = KernelSpec.from_text(json.dumps(_spec([arg, {"name": "out"}])))
    tmap = spec.steps[0].args[0]
    assert tmap.full_width is False and tmap.view == ["2 * x.shape[0]", "x.shape[1] * x.shape[2]", "x.shape[3]"]
    assert KernelSpec.model_validate(spec.model_dump()) == spec
    # at their defaults the new fields are left out of the dump, so older specs hash as before
    plain = KernelSpec.from_text(json.dumps(_spec([_map()])))
    assert set(plain.model_dump()["steps"][0]["args"][0]) == {"kind", "name", "box_rows", "box_cols", "swizzle"}
    assert plain.content_hash() == KernelSpec.from_text(json.dumps(_spec([_map(full_width=True)]))).content_hash()
    plan = _resolve([arg, {"name": "out"}])
    got = plan.launches[0].args[0]
    assert (got.full_width, got.view, got.box) == (False, (4, 300, 128), (64, 64))
    with pytest.raises(SpecError, match=r"args\.0\.tensormap\.view: List should have at least 2 items"):
        KernelSpec.from_text(json.dumps(_spec([_map(view=["4"])])))
    with pytest.raises(SpecError, match=r"tensormap view \(0, 600, 128\) has a dim <= 0"):
        _resolve([_map(view=["x.shape[0] - 2", 600, 128])])


def test_layout_of_a_k_tile_box_is_rank_3_and_takes_ragged_columns():
    lay = layout((1000, 1000), "bfloat16", 128, 64, 128, full_width=False)  # 1000 is no multiple of 64
    assert (lay.dims, lay.strides, lay.box, lay.box_bytes) == ((1000, 1000, 1), (2000, 2000000), (64, 128, 1),
                                                               64 * 128 * 2)
    lay = layout((2 * 3 * 200 * 20,), "float32", 256, 32, 128, full_width=False, view=(6, 200, 20))  # flat scratch
    assert (lay.dims, lay.strides, lay.box) == ((20, 200, 6), (80, 16000), (32, 256, 1))
    with pytest.raises(SpecError, match=r"tensormap: the view \(6, 200, 21\) \(25200 elements\) is not a shape of "
                                        r"the tensor \(24000,\) \(24000 elements\)"):
        layout((24000,), "float32", 256, 32, 128, full_width=False, view=(6, 200, 21))
    with pytest.raises(SpecError, match="a row of cols 1001 x 2 bytes = 2002 bytes is not a multiple of 16"):
        layout((8, 1001), "bfloat16", 8, 64, 128, full_width=False)
    assert layout_for(torch.zeros(24000), 256, 32, 128, full_width=False, view=(6, 200, 20)).dims == (20, 200, 6)


def test_encode_of_a_k_tile_map_is_rank_3(fake_driver):
    cu, calls, _ = fake_driver
    tensormap.encode(layout((2, 300, 136), "bfloat16", 128, 64, 128, full_width=False), 1 << 20)
    (args,) = calls
    assert args[1] == 3 and [int(d) for d in args[3]] == [136, 300, 2] and [int(s) for s in args[4]] == [272, 81600]
    assert [int(b) for b in args[5]] == [64, 128, 1]
