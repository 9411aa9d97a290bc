"""Seals on the harness's own tensors (pristine inputs, references, reference parameters): a far
write that lands there is caught even when it keeps the input and its copy equal. CPU tensors
stand in for device memory: the candidate's "write" is done here by hand."""

from __future__ import annotations

import pytest
import torch

from kerngen.harness.gpu.check import CandidateFailed, ProblemState, _verify_untouched, verify_timed_outputs
from kerngen.harness.gpu.integrity import SAMPLE, Seal, digest
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.results import CheckEvidence, CheckFailure
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

PLAN = ResolvedPlan(config={}, defines={}, scratch=[], steps=[])


def test_digest_is_stable_and_sees_any_change():
    x = torch.randn(1000, 37)
    key = 12345
    d = digest(x, key)
    assert digest(x.clone(), key) == d and isinstance(d, int) and 0 <= d < 2**64  # all 64 bits, exactly
    y = x.clone()
    y.view(torch.int32)[123, 7] ^= 1  # one bit
    assert digest(y, key) != d
    assert digest(x, key + 1) != d
    z = x.clone()
    z[0, 0], z[0, 1] = x[0, 1], x[0, 0]  # same values, other places
    # under every key: the two places' weights differ (drawn from 2**31 values; from 31, one key in 31 missed it)
    assert all(digest(z, k) != digest(x, k) for k in range(200))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.bool, torch.int64, torch.uint8])
def test_digest_every_dtype_and_odd_sizes(dtype):
    x = (torch.randn(7, 3) * 100).to(dtype)  # 21 elements: for 1- and 2-byte dtypes not whole words
    d = digest(x, 7)
    assert digest(x.clone(), 7) == d
    y = x.clone()
    y[-1, -1] = not bool(y[-1, -1]) if dtype is torch.bool else y[-1, -1] + 1
    assert digest(y, 7) != d


@pytest.mark.parametrize("offset", [1, 2, 3, 5, 6, 9, 10])
def test_a_view_at_an_odd_byte_offset_is_read_as_bytes(offset):
    base = torch.arange(40 + offset, dtype=torch.uint8)
    view = base[offset:]  # 40 bytes starting at an offset that is no multiple of 4: not viewable as int32
    d = digest(view, 5)
    assert digest(view, 5) == d  # (a seal digests the same tensor object every time)
    base[10 + offset] += 1
    assert digest(view, 5) != d


@pytest.mark.parametrize("size", [5, 10, 13])
def test_a_byte_tensor_of_no_whole_words_is_read_as_bytes(size):
    x = torch.arange(size, dtype=torch.uint8)
    d = digest(x, 3)
    y = x.clone()
    y[-1] += 1
    assert digest(x.clone(), 3) == d and digest(y, 3) != d


def test_large_tensors_are_sampled_small_ones_read_whole(monkeypatch):
    import kerngen.harness.gpu.integrity as integrity

    monkeypatch.setattr(integrity, "SAMPLE", 1000)
    x = torch.randn(100_000)
    assert digest(x.clone(), 3) == digest(x, 3)  # the same places for the same key
    y = x.clone()
    y[::10] = 0.0  # a tenth of the words changed: found under every key
    assert all(digest(y, k) != digest(x, k) for k in range(20))
    small = torch.randn(1000)  # at most SAMPLE words: every word is read
    for k in range(20):
        one = small.clone()
        one[(k * 37) % 1000] += 1.0
        assert digest(one, k) != digest(small, k)
    fewer = torch.randn(600)  # fewer words than SAMPLE: read whole too, not SAMPLE draws among them
    for k in range(20):
        one = fewer.clone()
        one[(k * 29) % 600] += 1.0
        assert digest(one, k) != digest(fewer, k)
    one = x.clone()  # a large tensor IS sampled: one changed word is missed under some key (1000 of 100,000 read)
    one[4321] += 1.0
    assert any(digest(one, k) == digest(x, k) for k in range(20))
    assert integrity.SAMPLE == 1000 and SAMPLE == 1 << 22


def test_seal_names_the_changed_tensor():
    a, b = torch.randn(64), torch.randn(64)
    seal = Seal()
    seal.add("a", a)
    seal.add("b", b)
    assert seal.broken() == "" and len(seal) == 2
    b[3] += 1
    assert seal.broken() == "b"


@pytest.fixture
def state():
    return ProblemState(load_problem(ProblemRef(source="conv2d", shape=(2, 3, 32, 32))), torch.device("cpu"))


def _evidence(state) -> CheckEvidence:
    return CheckEvidence(atol=state.info.atol, rtol=state.info.rtol)


def test_zeroing_the_input_and_its_pristine_copy_is_caught(state):
    bound = state.new_set(11, PLAN)
    _verify_untouched(state, bound, _evidence(state), "before")  # nothing touched: passes
    bound.inputs["x"].view.zero_()
    bound.pristine[0].zero_()  # the two still agree: only the seal sees it
    with pytest.raises(CandidateFailed) as failed:
        _verify_untouched(state, bound, _evidence(state), "before the reference")
    ev = failed.value.evidence
    assert ev.failed is CheckFailure.guard_overwritten and "pristine copy of argument 0" in ev.message


def test_copying_the_output_over_the_reference_is_caught_after_the_timed_runs(state):
    bound = state.new_set(12, PLAN)
    state.seal_refs(bound, state.reference(bound))
    out = bound.outputs["out"].view
    out.fill_(3.0)  # a wrong answer ...
    bound.refs[0].copy_(out)  # ... made to match by overwriting the reference
    ev = verify_timed_outputs(state, [bound])
    assert ev is not None and ev.failed is CheckFailure.guard_overwritten
    assert "reference output 0" in ev.message


def test_changing_a_parameter_and_the_reference_model_alike_is_caught_and_repaired(state):
    good = state.model.conv.weight.detach().clone()
    with torch.no_grad():
        state.params["conv.weight"].view.zero_()
        state.model.conv.weight.zero_()  # copy and source agree
    assert state.params_intact() == "conv.weight"
    state.reset_params()  # what the check does after input_mutated
    assert state.params_intact() == ""
    assert torch.equal(state.model.conv.weight.detach(), good)  # the model was built anew
