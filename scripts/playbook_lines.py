"""Issue #32's size gate at equal features: the playbook's lines (Python and templates under agent/playbook/)
at a base commit and now, and what each commit on main's first-parent line since changed them by.

    python3 scripts/playbook_lines.py                 # since e584391, the gate's base
    python3 scripts/playbook_lines.py --base REV --repo DIR

The refactor of issue #32 (one front end, one op table, regions, families as records) landed beside the
features of other issues that grew the same folder (the wgmma GEMM core of #35, the LSTM family and model
plans of #34, the TF32 precision of #33, ...). The commits that brought those features are listed in
``FEATURES`` by hash, each with its issue; every other commit counts as the refactor's. That errs against the
refactor: a feature commit missing from the table counts as refactor growth. A merge counts as the diff against
its first parent (its whole branch). Lines are counted as ``wc -l`` counts them: newline characters.

Prints one row per commit that changed the count, then the base, the features' growth, the refactor's, the count
now and the count at equal features (base + features). Exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BASE = "e584391"
FOLDER = "agent/playbook/"
SUFFIXES = (".py", ".j2")

# commits on main's first-parent line since e584391 that added features of other issues to the playbook
FEATURES: dict[str, str] = {
    "8696d86": "#35 the wgmma GEMM core (merge of main into i32, its hooks ported to the family records)",
    "879a1a9": "#34 whole models as plans",
    "9862a7b": "#34 trace_module for whole models",
    "65b883e": "#35 the wgmma convolution (i35b)",
    "a2237de": "#35 wgmma convolution: gather timing",
    "bd99d6e": "#35 wgmma convolution: wider gather copies",
    "1ad6cbc": "#33 the playbook at --precision tf32 (i33c)",
    "7d5bae8": "#37 a faster playbook listing (i37c)",
    "69170ce": "#35 the wgmma ideas' measured effect",
    "272625e": "#35 ping-pong consumers and clusters (i35c)",
    "66ebc40": "#34 conv_relu_maxpool's tensor-core variants (i34v)",
    "2da9011": "#34 the LSTM family (i34m)",
    "d24c349": "#34 the LSTM split-K recurrence (i40l)",
    "794d9a1": "#35 split-K for the wgmma convolution (i41k)",
    "ffa78a9": "#35 the wgmma convolution's split-K default",
    "2cdc9fd": "#35 the GEMM core's staged stores (EPI_SMEM)",
    "04d35e4": "#35 no staged stores for 3xTF32 (measured)",
    "51509a7": "#35 the space-to-depth convolution (wgmma_s2d)",
    "f83e723": "#35 the space-to-depth convolution: its first pre-pass again",
    "126d4db": "#35 the space-to-depth convolution: halo, FLUSH 2, ROT, the 16-byte x pre-pass",
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def lines_at(repo: Path, rev: str) -> int:
    """Newlines in the playbook's Python and template files at ``rev``."""
    listed = _git(repo, "ls-tree", "-r", rev, "--", FOLDER).splitlines()
    blobs = [row.split()[2] for row in listed if row.split("\t", 1)[1].endswith(SUFFIXES)]
    if not blobs:
        return 0
    out = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"], input=("\n".join(blobs) + "\n").encode(),
                         check=True, capture_output=True, text=False).stdout
    total, pos = 0, 0
    for _ in blobs:  # each answer: "<sha> blob <size>\n<content>\n"
        head_end = out.index(b"\n", pos)
        size = int(out[pos:head_end].split()[2])
        total += out[head_end + 1:head_end + 1 + size].count(b"\n")
        pos = head_end + 1 + size + 1
    return total


def commits(repo: Path, base: str) -> list[tuple[str, str, str]]:
    """(short hash, first parent, subject) of each commit on the first-parent line after ``base``, oldest first."""
    rows = _git(repo, "log", "--first-parent", "--reverse", "--format=%h %p%x00%s", f"{base}..HEAD").splitlines()
    out = []
    for row in rows:
        ids, subject = row.split("\x00", 1)
        short, *parents = ids.split()
        out.append((short, parents[0], subject))
    return out


def account(repo: Path, base: str, features: dict[str, str]) -> dict:
    """The base's count, each commit's delta with its owner (an issue from ``features``, else the refactor), the
    features' and the refactor's sums, and the count now."""
    rows, cache = [], {}

    def count(rev: str) -> int:
        if rev not in cache:
            cache[rev] = lines_at(repo, rev)
        return cache[rev]

    for short, parent, subject in commits(repo, base):
        delta = count(short) - count(parent)
        if delta:
            owner = next((why for h, why in features.items() if short.startswith(h) or h.startswith(short)), None)
            rows.append(dict(commit=short, delta=delta, feature=owner, subject=subject))
    start, now = count(base), count("HEAD")
    feat = sum(r["delta"] for r in rows if r["feature"])
    return dict(base=start, now=now, features=feat, refactor=now - start - feat, rows=rows)


def main(argv: list[str]) -> int:
    base, repo = BASE, Path(__file__).resolve().parents[1]
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag in ("--base", "--repo") and args:
            value = args.pop(0)
            base, repo = (value, repo) if flag == "--base" else (base, Path(value))
        else:
            print("usage: python3 scripts/playbook_lines.py [--base REV] [--repo DIR]", file=sys.stderr)
            return 1
    try:
        acc = account(repo, base, FEATURES)
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or "").strip().splitlines()
        print(f"playbook_lines: git failed: {said[0] if said else exc}", file=sys.stderr)
        return 1
    print("| commit | lines | owner | subject |\n|---|---|---|---|")
    for r in acc["rows"]:
        print(f"| {r['commit']} | {r['delta']:+d} | {r['feature'] or 'refactor (#32)'} | {r['subject'][:80]} |")
    equal = acc["base"] + acc["features"]
    print(f"\nat {base}: {acc['base']:,} lines; the features of other issues since: {acc['features']:+,}; "
          f"the refactor: {acc['refactor']:+,}\nnow: {acc['now']:,}; at equal features (base + features): {equal:,}; "
          f"now - equal features: {acc['now'] - equal:+,}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
