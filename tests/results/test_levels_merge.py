"""scripts/levels_merge.py: KernelBench's levels from the suite reports of their shards (scripts/device/levels.sh)."""

from __future__ import annotations

import gzip
import json

import pytest

from tests import resources

from kerngen.problems.ref import ProblemRef
from kerngen.results.suite import NoKernel, SuiteEntry, SuiteReport, Why, suite_metrics


@pytest.fixture(scope="module")
def merge():
    return resources.script("levels_merge.py", "levels_merge")


def entry(path: str, compile_x: float | None, eager_x: float | None = None, why: Why | None = None) -> SuiteEntry:
    return SuiteEntry(problem=path, ref=ProblemRef(source=path), verdict="ok" if why is None else "no_kernel",
                      why=NoKernel(kind=why, text=why.value) if why else None,
                      speedup_compile=compile_x, speedup_eager=eager_x if eager_x is not None else compile_x)


def report(entries: list[SuiteEntry]) -> dict:
    return SuiteReport(gpu="NVIDIA H200", entries=entries, metrics=suite_metrics(entries)).to_json()


def test_shards_merge_per_level_with_kerngens_own_metrics(merge, tmp_path, capsys):
    kb = "shared/kernelbench"
    (tmp_path / "a.json").write_text(json.dumps(report([
        entry(f"{kb}/level1/1_A.py", 2.0, 4.0), entry(f"{kb}/level1/2_B.py", 0.5),
        entry(f"{kb}/level2/1_C.py", None, why=Why.no_run)])))
    (tmp_path / "b.json").write_text(json.dumps(report([
        entry(f"{kb}/level2/2_D.py", None, why=Why.degenerate), entry(f"{kb}/level2/3_E.py", 1.5),
        entry(f"{kb}/level2/1_C.py", 3.0)])))  # C measured again by a later shard: its entry counts
    (tmp_path / "bad.json").write_text("{")
    rows = {r["level"]: r for r in merge.rows(merge.read_reports([tmp_path / "a.json", tmp_path / "b.json"])[0])}
    one, two = rows["level1"], rows["level2"]
    assert (one["problems"], one["correct"], one["fast_1_compile"]) == (2, 2, 0.5)
    assert one["geomean_compile"] == pytest.approx(1.0) and one["geomean_eager"] == pytest.approx(2 ** 0.5)
    assert (two["problems"], two["correct"], two["no_run"], two["degenerate"]) == (3, 2, 0, 1)
    assert two["geomean_compile"] == pytest.approx((1.5 * 3.0) ** 0.5) and two["fast_1_compile"] == pytest.approx(2 / 3)
    assert merge.main([str(tmp_path / "a.json"), str(tmp_path / "bad.json")]) == 0
    out, err = capsys.readouterr()
    assert "| level1 | 2 | 2 | 0 | 0 | 0.50 | 1.00x |" in out and "| level2 | 1 | 0 | 1 | 0 |" in out
    assert "left out:" in err and "bad.json" in err
    assert merge.main([str(tmp_path / "bad.json")]) == 1


def test_a_later_no_run_never_hides_a_measurement_but_a_later_verdict_does(merge, tmp_path):
    kb = "shared/kernelbench"
    (tmp_path / "s10.json").write_text(json.dumps(report([  # sorts first, measured later (a glob's order)
        entry(f"{kb}/level2/88_G.py", 1.7), entry(f"{kb}/level2/18_M.py", None, why=Why.degenerate),
        entry(f"{kb}/level2/5_N.py", None, why=Why.no_run)])))
    (tmp_path / "s9.json").write_text(json.dumps(report([
        entry(f"{kb}/level2/88_G.py", None, why=Why.no_run), entry(f"{kb}/level2/18_M.py", 2.0),
        entry(f"{kb}/level2/5_N.py", None, why=Why.no_run)])))
    got = {e.problem.rsplit("/", 1)[-1]: e for e in merge.latest(
        merge.read_reports([tmp_path / "s10.json", tmp_path / "s9.json"])[0])}
    assert got["88_G.py"].speedup_compile == 1.7  # the cut shard's "no run" does not count over it
    assert got["18_M.py"].speedup_compile == 2.0 and got["18_M.py"].why is None  # any other verdict: the later one
    assert got["5_N.py"].why.kind == Why.no_run and len(got) == 3


def test_files_lists_each_problem_once_in_number_order_with_its_reason(merge, tmp_path, capsys):
    kb = "shared/kernelbench"
    (tmp_path / "a.json").write_text(json.dumps(report([
        entry(f"{kb}/level1/10_J.py", 2.0, 4.0), entry(f"{kb}/level1/9_I.py", None, why=Why.no_run)])))
    (tmp_path / "b.json").write_text(json.dumps(report([
        entry(f"{kb}/level2/3_E.py", None, why=Why.degenerate), entry(f"{kb}/level1/9_I.py", 0.5, 0.8)])))
    rows = merge.file_rows(merge.read_reports([tmp_path / "a.json", tmp_path / "b.json"])[0])
    assert [(r["file"], r["correct"], r["why"], r["vs_compile"]) for r in rows] == [
        ("9_I.py", True, "", 0.5), ("10_J.py", True, "", 2.0), ("3_E.py", False, "degenerate", None)]
    assert merge.main(["--files", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:] == ["| level1 | 9_I.py | yes |  | - | - | - | 0.80x | 0.50x |",
                       "| level1 | 10_J.py | yes |  | - | - | - | 4.00x | 2.00x |",
                       "| level2 | 3_E.py | no | degenerate | - | - | - | - | - |"]


def test_families_group_the_files_by_the_checked_in_playbook_tables(merge):
    table = merge.families()
    assert table[("level1", "1_Square_matrix_multiplication_.py")] == "matmul" and len(table) == 200
    kb = "shared/kernelbench"
    reports = [SuiteReport.model_validate(report([
        entry(f"{kb}/level1/a.py", 2.0), entry(f"{kb}/level1/b.py", 0.5), entry(f"{kb}/level1/c.py", None, why=Why.no_run),
        entry(f"{kb}/level2/a.py", 3.0)]))]
    rows = merge.family_rows(reports, {("level1", "a.py"): "gemm", ("level1", "b.py"): "gemm",
                                       ("level1", "c.py"): "gemm", ("level2", "a.py"): "regions"})
    assert [(r["level"], r["family"], r["files"], r["correct"]) for r in rows] == [
        ("level1", "gemm", 3, 2), ("level2", "regions", 1, 1)]
    assert rows[0]["geomean_compile"] == pytest.approx(1.0) and rows[0]["fast_1_compile"] == pytest.approx(1 / 3)


def test_a_docs_table_per_file_and_a_gzipped_report_merge_as_reports(merge, tmp_path, capsys):
    """The rows `--files` printed into a doc read back as a report; a later (gzipped) report's entry of the same
    file replaces the row, whatever the path it names the file by."""
    kb = "shared/kernelbench"
    (tmp_path / "a.json").write_text(json.dumps(report([
        entry(f"{kb}/level1/9_I.py", 0.5, 0.8), entry(f"{kb}/level1/10_J.py", 2.0, 4.0),
        entry(f"{kb}/level2/3_E.py", None, why=Why.degenerate)])))
    assert merge.main(["--files", str(tmp_path / "a.json")]) == 0
    doc = tmp_path / "doc.md"
    doc.write_text("# a session\n\nsome text\n\n" + capsys.readouterr().out + "\nmore text\n| a | b |\n|---|---|\n")
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(json.dumps(report([
        entry(f"/elsewhere/{kb}/level1/9_I.py", 3.0, 3.0)])).encode()))
    (tmp_path / "empty.md").write_text("# nothing measured\n")
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b"{}")[:-4])
    from_doc = merge.rows(merge.read_reports([doc])[0])
    assert [(r["level"], r["problems"], r["correct"], r["degenerate"]) for r in from_doc] == [
        ("level1", 2, 2, 0), ("level2", 1, 0, 1)]
    assert from_doc[0]["geomean_compile"] == pytest.approx(1.0) and from_doc[0]["geomean_eager"] == pytest.approx(
        (0.8 * 4.0) ** 0.5)
    reports, bad = merge.read_reports([doc, tmp_path / "b.json.gz", tmp_path / "empty.md", tmp_path / "cut.json.gz"])
    assert len(reports) == 2 and [b.split(":")[0] for b in bad] == [str(tmp_path / "empty.md"), str(tmp_path / "cut.json.gz")]
    one = merge.rows(reports)[0]
    assert (one["problems"], one["correct"], one["fast_1_compile"]) == (2, 2, 1.0)
    assert one["geomean_compile"] == pytest.approx((3.0 * 2.0) ** 0.5)
