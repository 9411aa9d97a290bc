"""The error pattern of a failed comparison (harness/gpu/error_pattern.py): where the wrong elements
are and how wrong, one short line for the repair prompt; the same whatever the chunking. And the
rule that a within-tolerance output several percent off is a mismatch, not precision loss. CPU."""

from __future__ import annotations

import pytest
import torch

from kerngen.harness.gpu import check as gpu_check
from kerngen.harness.gpu import error_pattern as EP
from kerngen.harness.gpu.buffers import alloc_guarded, poison
from kerngen.harness.gpu.compare import compare, gross_rel_err, rel_err_limit
from kerngen.harness.gpu.error_pattern import describe
from kerngen.harness.results import CheckEvidence, CheckFailure

CPU = torch.device("cpu")


def _ref(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def pattern(out: torch.Tensor, ref: torch.Tensor, **kw) -> str:
    """The pattern read in one chunk and in chunks of 1000 (rows split between chunks): the same."""
    kw.setdefault("atol", 1e-4)
    kw.setdefault("rtol", 1e-4)
    whole, chunked = describe(out, ref, **kw), describe(out, ref, chunk=1000, **kw)
    assert whole == chunked
    assert len(whole) <= EP.MAX_CHARS and "\n" not in whole
    return whole


REF = _ref(256, 512)


def _with(fn) -> torch.Tensor:
    out = REF.clone()
    fn(out)
    return out


@pytest.mark.parametrize(
    "out, want",
    [
        (_with(lambda o: o[224:].add_(1)),
         "wrong in 32 of 256 rows: 224..255 (the last 32), all 512 columns of each; "
         "wrong values = reference + 1 (a constant offset: a bias added twice or missing?)"),
        (_with(lambda o: o[:, -63:].zero_()),
         "in every row only columns 449..511 (the last 63) are wrong (a tail not handled?); "
         "wrong values are 0 (never computed or stored?)"),
        (_with(lambda o: o.view(-1)[31::32].neg_()),
         "4096 of 131072 elements wrong, every 32nd element (index % 32 == 31: a vector width or lane stride?); "
         "wrong values = -reference (a sign error)"),
        (REF * 1.031, "wrong values = reference x 1.031 (a constant factor: a scale or normalisation bug?)"),
        (torch.roll(REF.reshape(-1), 1).view_as(REF),
         "the wrong values are the reference shifted by one element (an index off by one?)"),
        (torch.roll(REF, 1, 0), "the wrong values are the reference shifted by one row (an index off by one?)"),
        (_with(lambda o: o[1, 10:22].fill_(float("nan"))),
         "NaN in 12 elements where the reference is finite (first at out[1, 10]); wrong in 1 of 256 rows: 1, only "
         "columns 10..21"),
        (REF * torch.linspace(0.5, 1.5, 256).unsqueeze(1),
         "each wrong row = the reference row x its own factor (0.5..1.5): a per-row normalisation (row sum or "
         "max) bug?"),
        (_with(lambda o: o[::2].zero_()), "wrong in 128 of 256 rows: every 2nd from 0, all 512 columns of each"),
        (_with(lambda o: o[:, ::4].add_(1)), "wrong in every row; wrong columns: every 4th from 0"),
        (_with(lambda o: o[3, 7].add_(0.5)), "1 of 131072 elements wrong: out[3, 7]; wrong values off by"),
        (_with(lambda o: o[100:110, 5:9].add_(3)), "wrong in 10 of 256 rows: 100..109, only columns 5..8"),
    ],
    ids=["last-rows", "tail-columns", "every-32nd", "constant-factor", "shifted-element", "shifted-row", "nan",
         "per-row-factor", "every-other-row", "every-4th-column", "one-element", "block"],
)
def test_patterns_say_where_and_how(out, want):
    assert want in pattern(out, REF)


def test_a_scattered_few_percent_and_a_one_dimensional_range():
    noisy = REF.clone()
    noisy[torch.rand(REF.shape, generator=torch.Generator().manual_seed(1)) < 0.02] += 1
    text = pattern(noisy, REF)
    assert text.startswith(f"{int((noisy != REF).sum())} of 131072 elements wrong (2%), scattered over ")
    assert "columns, in every row; wrong values = reference + 1" in text
    x = _ref(100_000)
    out = x.clone()
    out[40_000:41_000] = 7.0
    assert pattern(out, x) == ("1000 of 100000 elements wrong: 40000..40999; wrong values are all 7, whatever the "
                               "reference (not computed from the input?)")


def test_integers_exactly():
    ref = torch.randint(0, 9, (64, 100), generator=torch.Generator().manual_seed(2))
    out = ref.clone()
    out[5] = -1
    c = compare(out, ref, atol=0, rtol=0)
    assert c.failed is CheckFailure.mismatch
    assert c.pattern == ("wrong in 1 of 64 rows: 5, all 100 columns of each; wrong values are all -1, whatever the "
                         "reference (not computed from the input?)")


@pytest.mark.parametrize("kind", ["nan", "huge", "random"])
def test_never_written_elements_are_said_apart(kind):
    gen = torch.Generator().manual_seed(3)
    buf = alloc_guarded("out", (256, 512), torch.float32, CPU, gen)
    p = poison(buf, kind, gen)
    buf.view[:128] = REF[:128]
    buf.view[0, :8] = 0.0  # and a few written wrong
    text = pattern(buf.view, REF, poison=p)
    assert text.startswith("never written (still poison) in 65536 of 131072 elements: 65536..131071 (the last "
                           "65536); rows 128..255; written but wrong: ")
    assert "wrong values are 0" in text
    c = compare(buf.view, REF, atol=1e-4, rtol=1e-4, poison=p, chunk=1000)
    assert c.failed is CheckFailure.unwritten_output and c.pattern == text


def test_memory_stays_bounded_for_a_long_output():
    """What the accumulator keeps does not grow with the output: bounded runs, 1024 residue counts,
    a bounded sample; per-column counts only up to COL_CAP columns, per-row sums up to ROW_FIT_CAP rows."""
    n = 3 * (1 << 20) + 17
    x = torch.arange(n, dtype=torch.float32) % 97
    out = x.clone()
    out[::2] += 1  # 1.5 M runs of one element
    acc = EP.PatternAccumulator((n,), 1e-4, 1e-4)
    for lo in range(0, n, 1 << 18):
        acc.add(lo, out[lo:lo + (1 << 18)], x[lo:lo + (1 << 18)])
    assert acc.col_counts is None and acc.row_fit is None and acc.residues.numel() == EP.STRIDE_BASE
    assert len(acc.flat_wrong.first) <= EP.MAX_RUNS and acc.flat_wrong.count == (n + 1) // 2
    assert sum(s.numel() for s in acc.samples) <= EP.SAMPLE
    assert acc.text().startswith(f"{(n + 1) // 2} of {n} elements wrong: every 2nd from 0")
    wide = EP.PatternAccumulator((2, EP.COL_CAP + 1), 1e-4, 1e-4)
    many_rows = EP.PatternAccumulator((EP.ROW_FIT_CAP + 1, 2), 1e-4, 1e-4)
    for acc, shape in ((wide, (2, EP.COL_CAP + 1)), (many_rows, (EP.ROW_FIT_CAP + 1, 2))):
        ref = torch.ones(shape).reshape(-1)
        acc.add(0, ref * 2, ref)
    assert wide.col_counts is None and many_rows.row_fit is None


def test_an_output_that_matches_has_no_pattern():
    assert describe(REF.clone(), REF, atol=1e-4, rtol=1e-4) == ""
    assert compare(REF.clone(), REF, atol=1e-4, rtol=1e-4).pattern == ""


# ----- a gross error is a mismatch, not precision loss ----------------------------------------------
SOFTMAX = torch.softmax(_ref(4, 65536).double(), dim=1).float()  # values ~1.5e-5: far under atol=1e-4


def test_a_few_percent_off_hidden_by_atol_is_a_mismatch():
    wrong = SOFTMAX * 1.031
    assert torch.allclose(wrong, SOFTMAX, atol=1e-4, rtol=1e-4)  # allclose alone passes it
    c = compare(wrong, SOFTMAX, atol=1e-4, rtol=1e-4)
    assert not c.ok and c.failed is CheckFailure.mismatch
    assert c.message == ("out: values wrong by 3.10% (||out-ref||/||ref|| = 0.031 > 0.01 for float32): a logic "
                         "error, not rounding; they pass atol=0.0001 only because they are small")
    assert c.pattern == ("all 262144 elements wrong; wrong values = reference x 1.031 (a constant factor: a scale "
                         "or normalisation bug?)")


@pytest.mark.parametrize("lower", [torch.bfloat16, torch.float16])
def test_a_lower_precision_inside_stays_precision_loss(lower):
    cheap = SOFTMAX.to(lower).float()
    c = compare(cheap, SOFTMAX, atol=1e-4, rtol=1e-4)
    assert c.failed is CheckFailure.precision_loss and rel_err_limit(torch.float32) < c.rel_err < 1e-2
    assert c.message.endswith("(lower precision inside?)")
    assert c.pattern.startswith("nearly all elements wrong") and "wrong values off by 0.1" in c.pattern


def test_the_gross_threshold_per_dtype():
    # five times anything a 16-bit rounding gives for fp32/fp64, five times the dtype's own limit for halves
    assert gross_rel_err(torch.float32) == gross_rel_err(torch.float64) == 1e-2
    for dt in (torch.float16, torch.bfloat16):
        assert gross_rel_err(dt) == pytest.approx(5 * rel_err_limit(dt))
    ref = torch.softmax(_ref(4, 4096).double(), dim=1).to(torch.bfloat16)
    c = compare((ref.float() * 1.08).to(torch.bfloat16), ref, atol=1e-2, rtol=1e-2)
    assert c.failed is CheckFailure.mismatch and "for bfloat16" in c.message


# ----- the evidence carries it ----------------------------------------------------------------------
def test_the_failed_evidence_carries_the_pattern():
    c = compare(SOFTMAX * 1.031, SOFTMAX, atol=1e-4, rtol=1e-4)
    evidence = CheckEvidence()
    with pytest.raises(gpu_check.CandidateFailed) as failed:
        gpu_check._fail(evidence, c.failed, f"seed 7, run before the reference: {c.message}", c.pattern)
    got = failed.value.evidence
    assert got.failed is CheckFailure.mismatch and got.pattern == c.pattern and got.message.startswith("seed 7")
    back = CheckEvidence.model_validate_json(got.model_dump_json())
    assert back.pattern == c.pattern
