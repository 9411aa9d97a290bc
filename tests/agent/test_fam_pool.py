"""The playbook's ``pool`` family (CPU tier): recognition of max/avg pooling 1-3D (KernelBench level 1
41-46 and written-here problems), refusals with their reasons, PyTorch's output-size formula, the
spec's rendering, resolution and NVRTC compilation, the compile-time reuse of window loads, and the
proposer's rounds."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cuda.bindings import nvrtc

from kerngen.agent.playbook import family_of, PlaybookProposer, explain
from kerngen.agent.playbook.pool.build import window_defaults
from kerngen.agent.playbook.pool.family import POOL as FAMILY, PoolFacts, output_size
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.graph import Tensor
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.proposer import NodeSummary, SearchContext
from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.results import EvalResult, GpuFacts, Verdict
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.resources import kernelbench

from tests.emu.runner import emulate

KB1 = kernelbench("level1")
needs_kb = pytest.mark.needs_kernelbench

KB_POOLS = {
    "41_Max_Pooling_1D.py": dict(mode="max", nd=1, kernel=(8,), stride=(1,), padding=(4,), dilation=(3,)),
    "42_Max_Pooling_2D.py": dict(mode="max", nd=2, kernel=(4, 4), stride=(1, 1), padding=(1, 1), dilation=(1, 1)),
    "43_Max_Pooling_3D.py": dict(mode="max", nd=3, kernel=(3,) * 3, stride=(2,) * 3, padding=(1,) * 3,
                                 dilation=(3,) * 3),
    "44_Average_Pooling_1D.py": dict(mode="avg", nd=1, kernel=(8,), stride=(1,), padding=(4,), dilation=(1,)),
    "45_Average_Pooling_2D.py": dict(mode="avg", nd=2, kernel=(11, 11), stride=(11, 11), padding=(0, 0),
                                     dilation=(1, 1)),
    "46_Average_Pooling_3D.py": dict(mode="avg", nd=3, kernel=(3,) * 3, stride=(2,) * 3, padding=(1,) * 3,
                                     dilation=(1,) * 3),
}

PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from cuda.bindings import nvrtc


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x):
        return {forward}


def get_inputs():
    return [torch.rand({shape}, dtype=torch.{dtype})]


def get_init_inputs():
    return []
"""


def _problem(tmp_path: Path, forward: str, shape: tuple[int, ...], init: str = "pass", dtype: str = "float32"):
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.py"
    path.write_text(PROBLEM.format(init=f"        {init}", forward=forward, shape=shape, dtype=dtype))
    return load_problem(str(path))



# ----- recognition -------------------------------------------------------------------------------
@needs_kb
@pytest.mark.parametrize("name", sorted(KB_POOLS))
def test_recognises_kernelbench_pools_with_their_geometry(name):
    m = explain(load_problem(str(KB1 / name)))
    assert m.family == "pool"
    want = KB_POOLS[name]
    assert {k: getattr(m.facts, k) for k in want} == want
    assert m.facts.ceil_mode is False and m.facts.count_include_pad is True


@pytest.mark.parametrize("forward,shape,facts", [
    ("F.max_pool2d(x, 3, 2, 1, 1, True)", (2, 3, 17, 19),
     dict(mode="max", kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True)),
    ("F.avg_pool3d(x, kernel_size=(2, 3, 3), stride=(1, 2, 2), padding=(1, 1, 0), count_include_pad=False)",
     (2, 2, 5, 9, 11), dict(mode="avg", kernel=(2, 3, 3), stride=(1, 2, 2), count_include_pad=False)),
    ("torch.nn.functional.avg_pool1d(x, 4)", (3, 4, 50), dict(mode="avg", kernel=(4,), stride=(4,))),
    ("F.max_pool1d(x, kernel_size=5, stride=2, dilation=2)", (7, 40), dict(mode="max", dilation=(2,), nd=1)),
])
def test_recognises_functional_pools(tmp_path, forward, shape, facts):
    m = explain(_problem(tmp_path, forward, shape))
    assert m.family == "pool"
    assert {k: getattr(m.facts, k) for k in facts} == facts


def test_reads_module_options(tmp_path):
    init = "self.pool = nn.AvgPool2d((3, 5), stride=(2, 3), padding=(1, 2), ceil_mode=True, count_include_pad=False)"
    m = explain(_problem(tmp_path, "self.pool(x)", (2, 3, 20, 31), init=init))
    assert m.facts.kernel == (3, 5) and m.facts.stride == (2, 3) and m.facts.padding == (1, 2)
    assert m.facts.ceil_mode is True and m.facts.count_include_pad is False


@pytest.mark.parametrize("init,forward,shape,word", [
    ("self.pool = nn.MaxPool2d(2, return_indices=True)", "self.pool(x)[0]", (2, 3, 8, 8), "return_indices"),
    ("self.pool = nn.AvgPool2d(2, divisor_override=3)", "self.pool(x)", (2, 3, 8, 8), "divisor_override"),
    ("self.pool = nn.AdaptiveAvgPool2d(4)", "self.pool(x)", (2, 3, 8, 8), "adaptive_avg_pool2d"),
    ("self.pool = nn.MaxPool2d(2)", "self.pool(x)", (2, 3, 8, 8), "fp32 only"),
])
def test_refuses_what_it_does_not_cover(tmp_path, init, forward, shape, word):
    """(F.lp_pool2d is traced as powers and an average pool: not one pooling op.)"""
    dtype = "float16" if word == "fp32 only" else "float32"
    p = _problem(tmp_path, forward, shape, init=init, dtype=dtype)
    with pytest.raises(NotCovered, match=word):
        FAMILY.recognise(trace(p))


@pytest.mark.parametrize("init,forward", [
    ("self.pool = nn.MaxPool2d(2)", "torch.relu(self.pool(x))"),  # a chain: another family's
    ("self.pool = nn.MaxPool2d(2)", "self.pool(x) * 2"),
    ("pass", "torch.relu(x)"),  # no pooling at all
    ("self.conv = nn.Conv2d(3, 4, 3)", "F.max_pool2d(torch.relu(self.conv(x)), 2)"),  # the built-in fused kernel's
])
def test_leaves_other_problems_to_other_families(tmp_path, init, forward):
    assert FAMILY.recognise(trace(_problem(tmp_path, forward, (2, 3, 16, 16), init=init))) is None


def test_the_fused_conv_relu_maxpool_stays_with_its_builtin_family(tmp_path):
    p = _problem(tmp_path, "F.max_pool2d(torch.relu(self.conv(x)), 2)", (2, 3, 16, 16),
                 init="self.conv = nn.Conv2d(3, 4, 3)")
    assert explain(p).family == "conv_relu_maxpool"


# ----- PyTorch's output size -----------------------------------------------------------------------
@pytest.mark.parametrize("size,k,s,p,d,ceil", [
    (n, k, s, p, d, c) for n, k, s, p, d, c in itertools.product((5, 8, 17), (1, 2, 3, 4), (1, 2, 3), (0, 1, 2),
                                                                  (1, 2), (False, True)) if 2 * p <= k
])
def test_output_size_is_pytorchs(size, k, s, p, d, ceil):
    x = torch.zeros(1, 1, size)
    try:
        want = F.max_pool1d(x, k, s, p, d, ceil_mode=ceil).shape[-1]
    except RuntimeError:  # PyTorch refuses the geometry (an empty output)
        assert output_size(size, k, s, p, d, ceil) < 1
        return
    assert output_size(size, k, s, p, d, ceil) == want


# ----- specs ----------------------------------------------------------------------------------------
def _kb_specs():
    if not KB1.is_dir():
        return []
    out = []
    for name in sorted(KB_POOLS):
        m = explain(load_problem(str(KB1 / name)))
        out.append((name, m, family_of(m).build(m, "window")))
    return out


KB_SPECS = _kb_specs()


@needs_kb
@pytest.mark.parametrize("name,m,spec", KB_SPECS, ids=[n for n, _, _ in KB_SPECS])
def test_default_config_resolves_and_compiles(name, m, spec):
    assert spec.name == FAMILY.spec_name("window")
    assert all(spec.defaults[k] in v and v == sorted(v) for k, v in spec.tunables.items())
    assert "{{" not in spec.source and 'extern "C" __global__' in spec.source
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    (launch,) = r.launches
    assert launch.block[0] * launch.grid[0] >= r.defines["TOTAL"] > 0
    out = m.outputs[0].shape
    assert (r.defines["OH"], r.defines["OW"]) == ((1,) + out[2:])[-2:]
    compiled = compile_job(job_for(spec, r, "sm_90"), cache=None)
    res = compiled.info.kernels[launch.kernel]
    assert res.spill_stores == 0 and res.registers <= 128


@needs_kb
@pytest.mark.parametrize("name,config", [
    ("42_Max_Pooling_2D.py", {"OPT": 1, "OPH": 1, "BLOCK": 128, "CACHE_HINT": 1}),
    ("43_Max_Pooling_3D.py", {"OPT": 2, "OPH": 2, "OPD": 2}),
    ("44_Average_Pooling_1D.py", {"OPT": 16, "BLOCK": 1024}),
    ("46_Average_Pooling_3D.py", {"OPT": 8, "OPH": 4, "OPD": 1}),
])
def test_other_configs_compile(name, config):
    m = explain(load_problem(str(KB1 / name)))
    spec = family_of(m).build(m, "window")
    compile_job(job_for(spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=config), "sm_90"), cache=None)


def test_ceil_mode_and_exclusive_padding_compile(tmp_path):
    init = "self.pool = nn.AvgPool2d((3, 5), stride=(2, 3), padding=(1, 2), ceil_mode=True, count_include_pad=False)"
    m = explain(_problem(tmp_path, "self.pool(x)", (2, 3, 20, 31), init=init))
    spec = family_of(m).build(m, "window")
    assert "(d1 - d0) * (h1 - h0) * (w1 - w0)" in spec.source and "max(d0, 0)" in spec.source
    compile_job(job_for(spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts()), "sm_90"), cache=None)


def test_constraints_check_the_output_shape(tmp_path):
    m = explain(_problem(tmp_path, "F.max_pool2d(x, 3, 2, 1)", (2, 3, 17, 19)))
    spec = family_of(m).build(m, "window")
    facts = m.tensor_facts()
    plan.resolve(spec, sizes={}, tensors=facts)
    facts["out"] = TensorFacts((2, 3, 9, 11))  # 19 -> 10 columns, not 11
    with pytest.raises(Exception, match="constraint"):
        plan.resolve(spec, sizes={}, tensors=facts)


def _geo(**kw) -> PoolFacts:
    return PoolFacts(mode="max", padding=(0,) * kw["nd"], ceil_mode=False, count_include_pad=True, **kw)


def test_defaults_reuse_overlapping_windows():
    """Overlapping windows get several outputs a thread along W (and H), disjoint ones do not need it."""
    over = window_defaults(_geo(nd=2, kernel=(4, 4), stride=(1, 1), dilation=(1, 1)))
    assert over["OPT"] >= 4 and over["OPH"] >= 2
    disjoint = window_defaults(_geo(nd=2, kernel=(11, 11), stride=(11, 11), dilation=(1, 1)))
    assert disjoint["OPH"] == 1
    wide = window_defaults(_geo(nd=1, kernel=(30,), stride=(1,), dilation=(2,)))
    assert wide["OPT"] == 4  # 8 outputs would need 66 values of a row in registers: halved until they fit


def test_a_window_wider_than_the_registers_is_recognised_but_not_offered(tmp_path):
    prop = PlaybookProposer(_problem(tmp_path, "F.avg_pool1d(x, 80)", (2, 3, 400)))
    assert prop.recognised is not None and prop.recognised.family == "pool"
    assert prop.match is None and "no pool variant admits" in prop.reason and "<= 64" in prop.reason


def _ptx(spec, resolved) -> str:
    _, prog = nvrtc.nvrtcCreateProgram(spec.source.encode(), b"k.cu", 0, [], [])
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17"] + [
        f"-D{k}={v}".encode() for k, v in {**resolved.config, **resolved.defines}.items()]
    assert nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    _, n = nvrtc.nvrtcGetPTXSize(prog)
    buf = b" " * n
    nvrtc.nvrtcGetPTX(prog, buf)
    return buf.decode()


def test_each_window_position_is_loaded_once_per_thread(tmp_path):
    """k 4, stride 1, 2 x 4 outputs a thread: 5 rows x 7 columns of input feed all 8 windows. The
    unrolled loops must fold to those 35 loads (once in the checked and once in the unchecked path),
    not one per window tap (2 * 4 * 16 = 128)."""
    m = explain(_problem(tmp_path, "F.max_pool2d(x, 4, 1, 1)", (2, 3, 64, 64)))
    spec = family_of(m).build(m, "window")
    ptx = _ptx(spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config={"OPT": 4, "OPH": 2}))
    loads = len(re.findall(r"ld\.global\.nc", ptx))
    assert 35 <= loads <= 3 * 35


# ----- proposer -----------------------------------------------------------------------------------
def test_proposer_rounds(tmp_path):
    prop = PlaybookProposer(_problem(tmp_path, "F.avg_pool2d(x, 3, 2, 1)", (4, 8, 33, 47)))
    assert prop.match is not None and prop.match.family == "pool"
    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in prop.match.tensors().items()}, gpu=GpuFacts(name="H100"))
    first = prop.ideas(ctx, None, 2)
    assert [i.text for i in first] == [FAMILY.ideas[0].text]
    (branch, *more) = prop.implement(ctx, None, first[0], 2)
    assert branch.spec is not None and branch.spec.name == "playbook-pool-window"
    parent = NodeSummary(node_id=1, idea=first[0], spec=branch.spec, result=EvalResult(verdict=Verdict.ok))
    later = prop.ideas(ctx, parent, 10)
    assert {i.text for i in later} == {e.text for e in FAMILY.ideas[1:]}
    configs = {tuple(sorted(b.spec.default_config().items())) for i in later
               for b in prop.implement(ctx, parent, i, 3) if b.spec is not None}
    assert len(configs) >= 6  # the refinements render distinct configurations


# ----- the kernels on the CPU emulator against PyTorch -------------------------------------------------
needs_emulator = pytest.mark.needs_cxx
TORCH_POOL = {("max", 1): F.max_pool1d, ("max", 2): F.max_pool2d, ("max", 3): F.max_pool3d,
              ("avg", 1): F.avg_pool1d, ("avg", 2): F.avg_pool2d, ("avg", 3): F.avg_pool3d}


def _at_shape(facts: dict | PoolFacts, shape: tuple[int, ...]) -> FamilyMatch:
    """A pool match with ``facts``' geometry over an input of ``shape`` (the family's own facts)."""
    facts = PoolFacts(**facts) if isinstance(facts, dict) else facts
    nd = facts.nd
    spatial = tuple(output_size(n, *a, facts.ceil_mode) for n, *a in
                    zip(shape[-nd:], facts.kernel, facts.stride, facts.padding, facts.dilation))
    return FamilyMatch("pool", [Tensor("x", shape, "float32")], [],
                       [Tensor("out", shape[:-nd] + spatial, "float32")], facts=facts)


def _torch_pool(f: dict, x: torch.Tensor) -> torch.Tensor:
    if f.mode == "max":
        return TORCH_POOL["max", f.nd](x, f.kernel, f.stride, f.padding, f.dilation,
                                          ceil_mode=f.ceil_mode)
    return TORCH_POOL["avg", f.nd](x, f.kernel, f.stride, f.padding, ceil_mode=f.ceil_mode,
                                      count_include_pad=f.count_include_pad)


def _emulated(m: FamilyMatch, config: dict | None = None, nan_at: int | None = None) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(m.x.shape, generator=gen)
    if nan_at is not None:
        x.view(-1)[nan_at] = float("nan")
    out = torch.full(m.outputs[0].shape, 12345.0)  # every element must be written
    emulate(family_of(m).build(m, "window"), {"x": x, "out": out}, config=config)
    want = _torch_pool(m.facts, x)
    assert torch.allclose(out, want, atol=1e-4, rtol=1e-4, equal_nan=True), (out - want).abs().nan_to_num().max()
    assert torch.equal(out.isnan(), want.isnan())


SMALL = {"41_Max_Pooling_1D.py": (2, 3, 61), "42_Max_Pooling_2D.py": (2, 2, 13, 17),
         "43_Max_Pooling_3D.py": (1, 2, 9, 11, 12), "44_Average_Pooling_1D.py": (2, 3, 45),
         "45_Average_Pooling_2D.py": (1, 2, 35, 40), "46_Average_Pooling_3D.py": (1, 2, 7, 9, 10)}


@needs_emulator
@needs_kb
@pytest.mark.parametrize("name", sorted(SMALL))
def test_kernelbench_default_kernels_match_pytorch_on_the_emulator(name):
    """Each KernelBench pool's geometry and default configuration at a small odd shape, a NaN
    included for the max pools (it must reach every window that covers it)."""
    m = explain(load_problem(str(KB1 / name)))
    small = _at_shape(m.facts, SMALL[name])
    _emulated(small, nan_at=29 if m.facts.mode == "max" else None)


@needs_emulator
@pytest.mark.parametrize("facts,shape,config", [
    (dict(mode="max", nd=2, kernel=(3, 2), stride=(2, 1), padding=(1, 1), dilation=(2, 1), ceil_mode=True,
          count_include_pad=True), (2, 3, 15, 14), {"OPT": 2, "OPH": 4}),
    (dict(mode="avg", nd=3, kernel=(3, 2, 3), stride=(2, 2, 2), padding=(1, 0, 1), dilation=(1, 1, 1),
          ceil_mode=True, count_include_pad=False), (1, 2, 6, 9, 11), {"OPT": 4, "OPH": 2, "OPD": 2}),
    (dict(mode="avg", nd=2, kernel=(4, 4), stride=(3, 3), padding=(2, 2), dilation=(1, 1), ceil_mode=False,
          count_include_pad=True), (1, 3, 16, 17), {"OPT": 1, "OPH": 1, "BLOCK": 64, "CACHE_HINT": 1}),
    (dict(mode="max", nd=1, kernel=(5,), stride=(4,), padding=(2,), dilation=(1,), ceil_mode=True,
          count_include_pad=True), (3, 50), {"OPT": 8}),
])
def test_edge_geometries_match_pytorch_on_the_emulator(facts, shape, config):
    """ceil_mode windows past the end, divisors with and without padding, unbatched input, gaps between
    windows (stride > kernel), several outputs a thread in every dim."""
    _emulated(_at_shape(facts, shape), config)
