"""Split-K for the wgmma convolution (issues 35 and 34), CPU tier: an output of fewer 128 x 128 tiles than the grid
(ResNet18's layer3/layer4 convolutions) defaults to a split that fills it (or one consumer where K is too short to
split), every other spec is built as before (byte for byte: the pinned hashes of test_tf32_terms.py and, here, the
no-split spec of a split shape equal to the one-launch spec); the split plan (two launches after the pre-passes, the
partials' scratch, the arguments), its constraints (every k slice non-empty), NVRTC for sm_90a without spills or wgmma
warnings, and the sum kernel (the template's own text) on the CPU emulator against PyTorch: slices in order, then
batch norm + residual + ReLU; a kernel that drops a slice or a reference that adds them in another order disagrees.
The GPU tier: test_gpu_conv_wgmma_splitk.py."""

from __future__ import annotations

import pytest
import torch

from kerngen.agent.playbook import explain
from kerngen.agent.playbook.conv.build_epi import frame
from kerngen.agent.playbook.conv.split_wgmma import (MIN_SLICE_KT, SHORT_SLICE_KT, SPLIT_CHOICES, SUM_KERNEL,
                                                     fill_defaults)
from kerngen.agent.playbook.render import render
from kerngen.harness.spec.spec import KernelSpec
from tests.agent.family_checks import forward_problem
from tests.agent.test_conv_wgmma import _compiles_clean, build
from tests.agent.test_gemm_wgmma import _admits, _maps, _resolve, emulate, emulator_available

# ResNet18's late regions (batch 16): conv (no bias) + eval batch norm [+ residual] [+ relu]
BN_ADD_RELU = "torch.relu(self.bn(self.conv(x)) + r)"


def region_problem(tmp_path, cin: int, cout: int, k: int, stride: int, hw: int, forward: str = BN_ADD_RELU,
                   n: int = 16, dtype: str = "float32"):
    """conv (no bias) + an eval-mode batch norm of random statistics [+ residual r] [+ ReLU], as a problem file."""
    oh = (hw + 2 * (k // 2) - k) // stride + 1
    init = f"self.conv = nn.Conv2d({cin}, {cout}, {k}, stride={stride}, padding={k // 2}, bias=False); " \
           f"self.bn = nn.BatchNorm2d({cout}); self.bn.running_mean.uniform_(-1, 1); " \
           "self.bn.running_var.uniform_(0.5, 2); self.bn.weight.data.uniform_(0.5, 1.5)"
    inputs = {"x": (n, cin, hw, hw), **({"r": (n, cout, oh, oh)} if "+ r" in forward else {})}
    return forward_problem(tmp_path, forward, inputs, init=init, dtype=dtype, make="randn")


def region(tmp_path, *args, **kw):
    m = explain(region_problem(tmp_path, *args, **kw))
    assert m.family == ("conv_epi" if kw.get("dtype", "float32") == "float32" else "conv16"), m.message
    return m


def test_small_outputs_default_to_a_split_that_fills_the_grid(tmp_path):
    l4 = region(tmp_path, 512, 512, 3, 1, 7)  # M 784, N 512: 7 x 4 = 28 tiles; K 4608: 144 k tiles of 32
    spec = build(l4)
    assert spec.default_config()["SPLIT_K"] == 4 and spec.default_config()["CWG"] == 2  # 112 units of 36 k tiles
    assert spec.tunables["SPLIT_K"] == list(SPLIT_CHOICES) and "split-K" in spec.description
    r = _resolve(spec, l4)
    assert [launch.kernel for launch in r.launches] == ["conv_wgmma_xprep", "conv_wgmma_wprep", "conv_wgmma",
                                                        SUM_KERNEL]
    total = 16 * 512 * 49
    assert [(s.name, s.size) for s in r.scratch][-1] == ("partials", 4 * total)
    main, add = r.launches[2], r.launches[3]
    assert main.grid == (112, 1, 1) and [a.name for a in main.args] == ["xs", "ws", "partials"]
    assert _maps(main) == [("ws", (128, 32), False, (2, 512, 4608))]
    assert add.grid == (-(-total // 256), 1, 1) and add.block == (256, 1, 1)
    names = [a.name for a in add.args]
    assert names[:3] == ["partials", "out", "r"] and len(names) == 7  # then the batch norm's four tensors
    assert "#define SPLIT_K 1" not in spec.source and SUM_KERNEL in spec.source
    # asked for no split: the one-launch spec, as every spec was before (no SPLIT_K, no sum kernel)
    one = build(l4, defaults={"SPLIT_K": 1})
    assert "SPLIT_K" not in one.tunables and "#define SPLIT_K 1" in one.source and SUM_KERNEL not in one.source
    assert [launch.kernel for launch in _resolve(one, l4).launches][-1] == "conv_wgmma"
    assert one.content_hash() != spec.content_hash()
    # layer3 3 x 3 (M 3136, N 256: 50 tiles): 2 slices; its 1 x 1 downsample (K 128: 4 k tiles) cannot split, so one
    # consumer (100 tiles of 64 rows); layer1 (M 50176: 392 tiles) as before
    assert build(region(tmp_path, 256, 256, 3, 1, 14)).default_config()["SPLIT_K"] == 2
    down = build(region(tmp_path, 128, 256, 1, 2, 28))  # ResNet18's r13: 4 k tiles, 2 slices of SHORT_SLICE_KT
    assert down.default_config()["SPLIT_K"] == 2 and down.default_config()["CWG"] == 2
    shallow = build(region(tmp_path, 64, 256, 1, 2, 28))  # 2 k tiles: no split keeps 2 a slice, one consumer
    assert "SPLIT_K" not in shallow.tunables and shallow.default_config()["CWG"] == 1
    big = build(region(tmp_path, 64, 64, 3, 1, 56, "torch.relu(self.bn(self.conv(x)))"))
    assert "SPLIT_K" not in big.tunables and big.default_config()["CWG"] == 2
    # what the caller names stays: a tile asked for is kept (and split to fill), a consumer count is never overridden
    assert build(l4, defaults={"CWG": 1}).default_config()["SPLIT_K"] == 2  # 13 x 4 = 52 tiles of 64 x 128
    assert "SPLIT_K" not in build(l4, defaults={"CWG": 1, "BN": 64}).tunables  # 104 tiles: no split fits one wave


def test_fill_defaults():
    cfg = dict(BN=128, WGM=1, CWG=2, BK=32, CTAS=132)
    assert fill_defaults(cfg, {}, 1, 784, 512, 4608) == {"SPLIT_K": 4}
    assert fill_defaults(cfg, {}, 1, 784, 512, 256) == {"SPLIT_K": 2}  # 8 k tiles: 2 slices of MIN_SLICE_KT
    assert MIN_SLICE_KT == 4 and SHORT_SLICE_KT == 2
    assert fill_defaults(cfg, {}, 1, 3136, 256, 128) == {"SPLIT_K": 2}  # 4 k tiles: 2 slices of SHORT_SLICE_KT
    assert fill_defaults(cfg, {}, 1, 3136, 256, 224) == {"SPLIT_K": 2}  # 7 k tiles: not 4 slices of 1
    assert fill_defaults(cfg, {}, 1, 3136, 256, 64) == {"CWG": 1}  # 2 k tiles: no split of 2 a slice
    assert fill_defaults(cfg, {"CWG": 2}, 1, 3136, 256, 64) == {}
    assert fill_defaults(cfg, {}, 1, 16 * 3136, 64, 576) == {}  # 392 tiles: the grid is full
    assert fill_defaults(dict(cfg, CTAS=66), {}, 1, 784, 512, 4608) == {"SPLIT_K": 2}


def test_split_constraints(tmp_path):
    l4 = region(tmp_path, 512, 512, 3, 1, 7)
    spec = build(l4)
    assert _admits(spec, l4, {"SPLIT_K": 16}) and _admits(spec, l4, {"SPLIT_K": 1})
    assert not _admits(spec, l4, {"SPLIT_K": 32})  # 144 k tiles in slices of 5: the last would be empty
    short = region(tmp_path, 128, 256, 1, 2, 28)  # K 128: 4 k tiles of 32
    s = build(short, defaults={"SPLIT_K": 4})
    assert _admits(s, short, {"SPLIT_K": 4}) and not _admits(s, short, {"SPLIT_K": 8})
    assert not _admits(s, short, {"SPLIT_K": 4, "BK": 64})  # 2 k tiles of 64
    with pytest.raises(ValueError, match="SPLIT_K 3"):
        build(l4, defaults={"SPLIT_K": 3})
    big = region(tmp_path, 64, 128, 3, 1, 56)  # 50176 x 128 outputs: past two waves of 128 x 128 tiles
    assert not _admits(build(big, defaults={"SPLIT_K": 2}), big, {})


@pytest.mark.parametrize("key", ["fp32", "bf16"])
def test_split_compiles_for_sm90a_without_spills_or_wgmma_warnings(tmp_path, key):
    if key == "fp32":
        m = region(tmp_path, 512, 512, 3, 1, 7)
        configs = [{}, {"SPLIT_K": 8, "CWG": 1}, {"SPLIT_K": 2, "BN": 64, "WGM": 2, "STAGES": 2}, {"SPLIT_K": 1}]
    else:
        m = region(tmp_path, 256, 256, 3, 1, 14, dtype="bfloat16")
        configs = [{}, {"SPLIT_K": 4, "BN": 128, "WGM": 2}]
    spec = build(m)
    assert "SPLIT_K" in spec.tunables
    for cfg in configs:
        _compiles_clean(spec, m, cfg)


# ----- the sum kernel on the CPU emulator -------------------------------------------------------------------------
# the core's fp32 element helpers (_gemm_wgmma_parts.cuh.j2, whose wgmma and TMA code the emulator cannot compile)
_HELPERS = """typedef float gw_st;
struct gw_in {
  const gw_st *p;
  __device__ __forceinline__ float operator[](long long i) const { return __ldg(p + i); }
};
__device__ __forceinline__ gw_st gw_out(float v) { return v; }
"""


def _sum_source(m) -> tuple[str, KernelSpec]:
    """The sum kernel's source as the template writes it for ``m``'s epilogue (behind the core's fp32 helpers), and
    ``m``'s split spec (its sum launch's arguments)."""
    tv = frame(m).template_vars
    src = render("_epilogue.cuh.j2") + _HELPERS + render(
        "_conv_wgmma_sum.cuh.j2", sum_kernel=SUM_KERNEL, has_bias=tv["has_bias"], statements=tv["ep_statements"],
        expr=tv["ep_expr"], n_ep=tv["n_ep"])
    spec = build(m, defaults={"SPLIT_K": 2})
    assert src.split(SUM_KERNEL)[1].split("\n}\n")[0] in spec.source  # the same kernel text as the spec's
    return src, spec


@pytest.mark.skipif(not emulator_available(), reason="no C++ compiler (g++) for the CPU emulator")
def test_the_sum_kernel_on_the_cpu_emulator(tmp_path):
    n, c, hw, split = 2, 24, 5, 3
    m = region(tmp_path, c, c, 3, 1, hw, n=n)
    src, spec = _sum_source(m)
    r = _resolve(spec, m)
    add = r.launches[-1]
    total = n * c * hw * hw
    g = torch.Generator().manual_seed(41)
    # partials of very different magnitudes: fp32 addition in another order rounds differently
    parts = (torch.randn(split, total, generator=g) * torch.tensor([1e4, 1.0, 1e-3])[:, None]).contiguous()
    res = torch.randn(n, c, hw, hw, generator=g)
    mean, var, w, b = (torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g),
                       torch.randn(c, generator=g))
    bound = {"partials": parts.view(-1), "r": res, "bn.running_mean": mean, "bn.running_var": var,
             "bn.weight": w, "bn.bias": b}
    names = [a.name for a in add.args]
    assert set(names) - {"out"} == set(bound), names

    def run(slices: int) -> torch.Tensor:
        out = torch.full((n, c, hw, hw), float("nan"))
        kernel = KernelSpec(source=src, defines=dict(N_=n, OC_=c, CW_OHW=hw * hw, SPLIT_K=slices),
                            steps=[dict(kernel=SUM_KERNEL, grid=[-(-total // 256)], block=[256],
                                        args=[{"name": a} for a in names])])
        emulate(kernel, {**bound, "out": out})
        return out

    def reference(order) -> torch.Tensor:
        v = parts[order[0]].clone()
        for z in order[1:]:
            v = v + parts[z]
        y = v.view(n, c, hw, hw)
        ch = (None, slice(None), None, None)
        y = (y - mean[ch]) * torch.rsqrt(var[ch] + 1e-5) * w[ch] + b[ch]
        return torch.relu(y + res)

    got, want = run(split), reference([0, 1, 2])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (got - want).abs().max()
    # the check can tell: slices added in another order, or one left out, are different numbers
    assert not torch.equal(reference([2, 1, 0]), reference([0, 1, 2]))
    sums = [parts[0] + parts[1] + parts[2], parts[2] + parts[1] + parts[0]]
    assert not torch.equal(sums[0], sums[1])
    missing = run(split - 1)
    assert not torch.allclose(missing, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(run(split), got), "the sum is not the same on every run"


@pytest.mark.skipif(not emulator_available(), reason="no C++ compiler (g++) for the CPU emulator")
def test_the_sum_adds_the_slices_in_slice_order_bit_for_bit(tmp_path):
    """With ReLU alone after the sum the kernel's output is exactly relu(p0 + p1 + p2 + p3) in fp32, and not the
    same sum in the reverse order (the partials' magnitudes make the two differ), so a kernel that adds the slices in
    another order, or misses one, fails."""
    n, c, hw, split = 2, 16, 3, 4
    m = region(tmp_path, c, c, 3, 1, hw, "torch.relu(self.conv(x))", n=n)
    src, spec = _sum_source(m)
    names = [a.name for a in _resolve(spec, m).launches[-1].args]
    assert names == ["partials", "out"]
    total = n * c * hw * hw
    g = torch.Generator().manual_seed(35)
    parts = (torch.randn(split, total, generator=g) * torch.tensor([3e3, 1.0, 7e-4, 20.0])[:, None]).contiguous()
    out = torch.full((n, c, hw, hw), float("nan"))
    emulate(KernelSpec(source=src, defines=dict(N_=n, OC_=c, CW_OHW=hw * hw, SPLIT_K=split),
                       steps=[dict(kernel=SUM_KERNEL, grid=[-(-total // 256)], block=[256],
                                   args=[{"name": "partials"}, {"name": "out"}])]), {"partials": parts.view(-1), "out": out})
    forward, backward = parts[0] + parts[1] + parts[2] + parts[3], parts[3] + parts[2] + parts[1] + parts[0]
    assert torch.equal(out.view(-1), torch.relu(forward))
    assert not torch.equal(out.view(-1), torch.relu(backward))
    assert not torch.equal(out.view(-1), torch.relu(parts[0] + parts[1] + parts[2]))
