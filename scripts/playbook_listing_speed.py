"""How much faster ``kerngen playbook DIR`` lists a folder now that its offers stop at each variant's first usable
configuration (issue 37) instead of counting every admissible one, and proof that it lists the same thing.
For each problem file of the folders given: the proposer's offer worked out both ways in this one process
(``exhaustive=True``: what the listing did before; ``exhaustive=False``: what it does now), timed (the file's
load and trace are left out: both ways pay them), and compared on everything a row or a written spec depends
on (family, reason, each variant's why, defaults, moved default and spec hash). A developer's tool, no GPU:

    python3 scripts/playbook_listing_speed.py problems/suite ../shared/kernelbench/level2

Prints one line per file and the totals last; exits 1 when any file's listing differs. The command a user
times is ``kerngen playbook DIR --no-cache --jobs 1`` (docs/playbook.md has the figures)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kerngen.agent.playbook.coverage import default_limits
from kerngen.agent.playbook.coverage_table import problem_files
from kerngen.agent.playbook.proposer import PlaybookProposer
from kerngen.errors import KerngenError
from kerngen.problems.load import load_problem


def _listed(prop: PlaybookProposer) -> tuple:
    off = prop.offer
    if off is None:
        return (prop.reason,)
    return (prop.recognised.family, prop.reason, [(v.variant, v.why, v.defaults, v.moved_from,
                                                    v.spec.content_hash() if v.spec else None) for v in off.variants])


def _timed(path: Path, exhaustive: bool) -> tuple[float, tuple]:
    problem = load_problem(str(path))
    t0 = time.perf_counter()
    prop = PlaybookProposer(problem, gpu=default_limits(), exhaustive=exhaustive)
    return time.perf_counter() - t0, _listed(prop)


def main(folders: list[str]) -> int:
    files = [f for d in folders for f in problem_files(Path(d))]
    if not files:
        print("usage: playbook_listing_speed.py DIR [DIR ...] (folders of problem files)", file=sys.stderr)
        return 2
    total_full = total_fast = 0.0
    differ = []
    print(f"{'file':56} {'counted s':>10} {'listed s':>9}  same")
    for f in files:
        try:
            t_full, full = _timed(f, True)
            t_fast, fast = _timed(f, False)
        except KerngenError as exc:
            print(f"{f.name[:56]:56} does not load: {str(exc)[:80]}")
            continue
        total_full, total_fast = total_full + t_full, total_fast + t_fast
        if full != fast:
            differ.append(f.name)
        print(f"{f.name[:56]:56} {t_full:10.2f} {t_fast:9.2f}  {'yes' if full == fast else 'NO'}", flush=True)
    print(f"{len(files)} files: offers counted {total_full:.1f} s, listed {total_fast:.1f} s "
          f"({total_full / max(total_fast, 1e-9):.0f}x); listings that differ: {len(differ)} {' '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
