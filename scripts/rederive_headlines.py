"""Re-derive the H100 KernelBench level headlines (the README's table until 2026-11-29, kept since in
docs/measurements/README.md, "KernelBench whole levels on one H100") from the per-file tables there. The README's
table now is the H200 re-measure of all 200 files: `scripts/levels_merge.py` re-derives that one.

Level 1: the session-9 per-file table ("**Level 1 per file**"), with the conv_nd rows measured since
("conv_nd per file, level 1") and file 8's later figure (1.23x torch.compile, the padded 3xTF32
kernel) put in; level 2: its per-file rows (only "conv_nd per file, level 2" exist). Prints what
the rows give beside what that table says; a level without rows for all its correct files says so.

    python scripts/rederive_headlines.py
"""

from __future__ import annotations

import math
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "measurements" / "README.md"
FILE_8 = "8_Matmul_with_irregular_shapes_"
# what the H100 table says (correct, fast_1 e/c, geomean e/c); level 1's row is these rows' own since 2026-11-29 (it said
# 0.86, 0.83, 1.74x from rows not kept), level 2's is marked there as not backed
REPORTED = {1: (96, 0.74, 0.72, 1.71, 1.51), 2: (63, 0.61, 0.59, 1.51, 1.32)}


def table(lines: list[str], heading: str) -> list[list[str]]:
    i = next(k for k, l in enumerate(lines) if l.startswith(heading))
    k = i + 1
    while not lines[k].startswith("|"):
        k += 1
    rows = []
    for line in lines[k + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def ratio(text: str) -> float:
    return float(text.rstrip("x"))


def summary(level: int, rows: dict[str, tuple[float, float]], files: int = 100) -> str:
    n = len(rows)
    ge = math.exp(sum(math.log(e) for e, _ in rows.values()) / n)
    gc = math.exp(sum(math.log(c) for _, c in rows.values()) / n)
    fe = sum(e > 1 for e, _ in rows.values()) / files
    fc = sum(c > 1 for _, c in rows.values()) / files
    rep = REPORTED[level]
    return (f"level {level}: rows for {n} files (reported correct: {rep[0]}); from the rows: fast_1 {fe:.2f} vs eager, "
            f"{fc:.2f} vs torch.compile, geomean {ge:.2f}x / {gc:.2f}x (reported {rep[1]:.2f}, {rep[2]:.2f}, "
            f"{rep[3]:.2f}x / {rep[4]:.2f}x)")


def main() -> None:
    lines = DOC.read_text().split("\n")
    one = {r[0]: (ratio(r[5]), ratio(r[6])) for r in table(lines, "**Level 1 per file**")}
    one.update({r[0]: (ratio(r[5]), ratio(r[6])) for r in table(lines, "conv_nd per file, level 1")})
    one[FILE_8] = (one[FILE_8][0], 1.23)
    print(summary(1, one))
    two = {r[0]: (ratio(r[5]), ratio(r[6])) for r in table(lines, "conv_nd per file, level 2")}
    print(summary(2, two) + ": not enough rows to back the headline")


if __name__ == "__main__":
    main()
