"""The playbook's coverage of a folder of problem files (a KernelBench level, a model's ops): per
file, its family and the variants offered at the file's own size for a GPU's limits, or why the
playbook has nothing. ``kerngen playbook DIR`` prints it; the checked-in table of KernelBench's
levels 1 and 2 (``tests/data/playbook/kernelbench_families.json``) is its ``--json`` output.

A file that does not load is a row with the loader's one-line reason, never an exception: the
folder is someone else's and may hold anything."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from kerngen.errors import KerngenError
from kerngen.harness.results import GpuFacts
from kerngen.problems.load import load_problem
from kerngen.text import one_line

from kerngen.agent.playbook.proposer import PlaybookProposer

__all__ = ["CoverageRow", "coverage_row", "problem_files"]

_NUMBERED = re.compile(r"^(\d+)_")


@dataclass(frozen=True)
class CoverageRow:
    file: str  # relative to the folder
    family: str  # "-" when no family is recognised
    variants: tuple[str, ...]  # offered at the file's size; empty: nothing offered
    why: str  # why nothing is offered ("" when a variant is)

    def to_json(self) -> dict:
        d = asdict(self)
        d["variants"] = list(self.variants)
        return d


def _order(path: Path) -> tuple:
    m = _NUMBERED.match(path.name)
    return (str(path.parent), int(m.group(1)) if m else 1 << 30, path.name)


def problem_files(folder: Path) -> list[Path]:
    """The .py files of ``folder``, else of its sub-folders (KernelBench/level1, level2, ...), in
    KernelBench's numeric order."""
    found = [p for p in folder.glob("*.py") if p.is_file() and not p.name.startswith("_")]
    if not found:
        found = [p for p in folder.glob("*/*.py") if p.is_file() and not p.name.startswith("_")]
    return sorted(found, key=_order)


def coverage_row(path: Path, folder: Path, gpu: GpuFacts | None = None, exhaustive: bool = False) -> CoverageRow:
    """``path``'s row. Its offers stop at each variant's first usable configuration unless ``exhaustive``
    (:func:`kerngen.agent.playbook.coverage.offer`): the same row, without counting what the row does not show."""
    name = path.relative_to(folder).as_posix()
    try:
        prop = PlaybookProposer(load_problem(str(path)), gpu=gpu, exhaustive=exhaustive)
    except KerngenError as exc:
        return CoverageRow(name, "-", (), one_line(f"does not load: {exc}", 300))
    family = prop.recognised.family if prop.recognised is not None else "-"
    offered = tuple(v.variant for v in prop.offer.offered) if prop.offer is not None else ()
    return CoverageRow(name, family, offered, "" if offered else one_line(str(prop.reason or "no variant offered"), 300))
