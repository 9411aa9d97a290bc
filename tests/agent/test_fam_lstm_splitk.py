"""The lstm family's ``splitk`` recurrence (CPU tier): the model plan of problems/models/lstm.py takes it first, with
the geometry its default gives at that size; the joined spec through the CPU emulator against torch.nn.LSTM at small
sizes, at its default and at configurations that exercise every part of it (several blocks along units and along
batch rows, several warps splitting K, several lanes' units and rows, several cp.async groups), in every form (h0 / c0
given, hidden not a multiple of 4, sequence first, no biases, odd batch, one to three layers); a kernel whose partial
sums are read before every warp wrote them fails; its constraints refuse what does not fit; NVRTC compiles the
model-size kernels for sm_90 without spills at its default and at a sample of its admissible configurations."""

from __future__ import annotations

import itertools
import random

import pytest

from kerngen.agent.playbook import explain, family_of
from kerngen.agent.playbook.model_plan import plan_model
from kerngen.agent.playbook.rnn.splitk import SK_TUNABLES
from kerngen.errors import SpecError
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.agent.family_checks import problem_files
from tests.agent.test_fam_lstm import CASES, FIELDS, PROBLEM, _close, _emulated
from tests.resources import ROOT

needs_emulator = pytest.mark.needs_cxx

MORE = {  # odd batch and hidden, sequence first, h0 / c0 given; a wider two-layer one (several blocks each way)
    "odd_seq_first": ("5, 10, 1", "x, h0, c0", "self.lstm(x, (h0, c0))[0]",
                      "torch.randn(6, 3, 5), torch.randn(1, 3, 10), torch.randn(1, 3, 10)"),
    "wide": ("12, 36, 2, batch_first=True", "x", "self.lstm(x)[0]", "torch.randn(9, 4, 12)"),
}
# case -> configurations: JB units a block, UJ units a lane, BR rows a lane, KW warps (K slices), NG copy groups
CONFIGS = {
    "two_layers": [{"JB": 4, "UJ": 1, "BR": 1, "KW": 4, "NG": 2}, {"JB": 2, "UJ": 2, "BR": 1, "KW": 16, "NG": 1}],
    "given_state": [{"JB": 4, "UJ": 2, "BR": 1, "KW": 2, "NG": 4}, {"JB": 8, "UJ": 1, "BR": 1, "KW": 8, "NG": 2}],
    "seq_first_no_bias": [{"JB": 2, "UJ": 1, "BR": 1, "KW": 2, "NG": 2}],
    "odd_seq_first": [{"JB": 2, "UJ": 1, "BR": 1, "KW": 4, "NG": 4}],
    "wide": [{"JB": 16, "UJ": 1, "BR": 2, "KW": 2, "NG": 2}, {"JB": 8, "UJ": 4, "BR": 1, "KW": 4, "NG": 2},
             {"JB": 4, "UJ": 1, "BR": 2, "KW": 8, "NG": 1}],
}


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    return problem_files(tmp_path_factory.mktemp("lstm_splitk"), PROBLEM, {**CASES, **MORE}, FIELDS)


def _model():
    mp = plan_model(load_problem(str(ROOT / "problems" / "models" / "lstm.py")))
    step = next(s for s in mp.plan.kernel_steps if s.family == "lstm")
    region = next(r for r in mp.regions if r.family == "lstm")
    return region, step


def test_the_model_plan_takes_splitk_first_with_its_geometry():
    region, step = _model()
    assert region.variant == "splitk" and region.offered[0] == "splitk", region.why
    assert "persistent" in region.offered  # the older recurrence stays on offer
    assert [s.kernel for s in step.spec.steps] == ["r0_sgemm_tf32x3", "r1_lstm_splitk", "r2_sgemm_tf32x3",
                                                   "r3_lstm_splitk"]
    assert all(s.cooperative == s.kernel.endswith("lstm_splitk") for s in step.spec.steps)
    assert {k: step.config[k] for k in SK_TUNABLES} == {"JB": 16, "UJ": 2, "BR": 4, "KW": 8, "NG": 2}
    r = plan.resolve(step.spec, sizes={}, tensors=region.region.match.tensor_facts(), config=step.config)
    # 32 unit groups x 4 groups of 16 batch rows = 128 blocks (one an SM), 8 warps; W_hh's 64 rows and h's 16 rows
    # of 516 floats, and 8 x 4 x 16 x 24 partial sums over the h rows (24 = 16 units + 8: 8 lanes across units times
    # 3, an odd number): 181,248 bytes
    assert r.steps[1].grid == (32, 4, 1) and r.steps[1].block == (256, 1, 1)
    assert r.steps[1].shared_mem == (64 * 516 + max(16 * 516, 8 * 4 * 16 * 24)) * 4 == 181248


@needs_emulator
@pytest.mark.parametrize("case", sorted({**CASES, **MORE}))
def test_splitk_matches_torch_lstm_at_its_default(problems, case):
    m = explain(problems[case])
    got, want = _emulated(family_of(m).build(m, "splitk"), problems[case])
    assert _close(got, want), (got - want).abs().max()


@needs_emulator
@pytest.mark.parametrize("case,config", [(c, k) for c, ks in CONFIGS.items() for k in ks],
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()))
def test_splitk_matches_torch_lstm_at_other_configurations(problems, case, config):
    m = explain(problems[case])
    got, want = _emulated(family_of(m).build(m, "splitk", config), problems[case], seed=7)
    assert _close(got, want), (got - want).abs().max()


@needs_emulator
def test_partial_sums_read_before_every_warp_wrote_them_fail(problems):
    m = explain(problems["two_layers"])
    spec = family_of(m).build(m, "splitk", {"JB": 4, "UJ": 1, "BR": 1, "KW": 4, "NG": 2})
    barrier = "__syncthreads();  // every warp's partial sums are in place"
    assert spec.source.count(barrier) == 2  # one a layer
    got, want = _emulated(spec, problems["two_layers"])
    assert _close(got, want)
    got, want = _emulated(spec.model_copy(update={"source": spec.source.replace(barrier, "")}), problems["two_layers"])
    assert not _close(got, want)


def test_a_gpu_of_fewer_sms_gets_a_grid_that_is_resident_at_once():
    """The default's 128 blocks of 181 KB (one an SM) cannot all be resident on an H100 PCIe's 114 SMs: static
    pruning refuses them there with the reason, and a model run's region search starts the variant from the nearest
    configuration that fits (it would otherwise fail at launch and the variant go untuned); where the default fits,
    or the SM count is unknown, the default stays."""
    from types import SimpleNamespace

    import torch

    from kerngen.agent.model_region import _fitting
    from kerngen.expr import TensorFacts
    from kerngen.harness.results import GpuFacts
    from kerngen.harness.tune.prune import static_reason

    region, step = _model()
    r = region.region
    env = {t.name: torch.empty(t.shape, device="meta") for t in (*r.inputs, *r.params, r.output)}
    shapes = {n: TensorFacts(tuple(env[v].shape)) for n, v in step.bindings.items()}
    shapes["out"] = TensorFacts(tuple(r.output.shape))

    def refused(config, sms):
        return static_reason(step.spec, config, sizes=step.sizes, tensors=shapes, gpu=GpuFacts(name="g", sm_count=sms))

    _, kind, why = refused(step.config, 114)
    assert kind == "plan" and "cooperative grid of 128 blocks, but at most 114 can be resident" in why
    assert refused(step.config, 132)[1] == "" and refused(step.config, 0)[1] == ""
    for sms, moved in ((0, False), (132, False), (114, True)):
        ctx = SimpleNamespace(facts=GpuFacts(name="g", sm_count=sms), sizes=step.sizes, env=env)
        cfg = _fitting(ctx, region, "splitk", 0)
        assert (cfg is not None) == moved, (sms, cfg)
        if moved:
            assert refused({**step.config, **cfg}, 114)[1] == ""
            assert sum(cfg[k] != step.config[k] for k in cfg) == 1  # a neighbour of the default
        assert _fitting(ctx, region, "persistent", 0) is None  # small blocks: several an SM, 128 fit anywhere


def test_the_constraints_refuse_what_does_not_fit():
    region, step = _model()
    facts = region.region.match.tensor_facts()
    for bad, why in (({"JB": 32, "UJ": 1, "BR": 8}, "<= 231424"),  # 128 W_hh rows: 264 KB of shared memory
                     ({"JB": 4, "UJ": 1, "BR": 1}, "<= 128"),  # 128 x 4 blocks: not resident at once
                     ({"JB": 16, "UJ": 4, "BR": 2, "KW": 16}, "96 if KW >= 16"),  # registers: 128 a thread at 512
                     ({"JB": 2, "UJ": 4}, "JB % UJ == 0")):
        with pytest.raises(SpecError, match="constraint violated") as e:
            plan.resolve(step.spec, sizes={}, tensors=facts, config={**step.config, **bad})
        assert why in str(e.value), (bad, str(e.value))


def test_the_model_size_kernels_compile_for_sm_90_without_spills():
    region, step = _model()
    facts = region.region.match.tensor_facts()
    admissible = []
    for values in itertools.product(*SK_TUNABLES.values()):
        config = {**step.config, **dict(zip(SK_TUNABLES, values))}
        try:
            plan.resolve(step.spec, sizes={}, tensors=facts, config=config)
        except SpecError:
            continue
        admissible.append(config)
    assert len(admissible) >= 20
    grids = {plan.resolve(step.spec, sizes={}, tensors=facts, config=c).launches[1].grid for c in admissible}
    assert min(g[0] * g[1] for g in grids) <= 64  # a GPU of fewer than 128 SMs still has a grid resident at once
    regs = lambda c: 4 * c["UJ"] * c["BR"] + 16 * c["UJ"] + 4 * c["BR"]  # noqa: E731 - the constraint's count
    widest = [max((c for c in admissible if (c["KW"] == 16) == wide), key=regs) for wide in (True, False)]
    for config in (step.config, *widest, *random.Random(0).sample(admissible, 2)):
        r = plan.resolve(step.spec, sizes={}, tensors=facts, config=config)
        compiled = compile_job(job_for(step.spec, r, "sm_90"), cache=None)
        assert compiled.info is not None and len(compiled.info.kernels) == 4
        assert all(k.spill_stores == 0 and k.spill_loads == 0 for k in compiled.info.kernels.values()), config
