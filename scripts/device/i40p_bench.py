"""Another tree's playbook specs against this tree's, side by side on one GPU (run by scripts/device/i40p.sh and
i40q.sh). ``--before FILE`` (default ``i40p_before.json.gz``: what main f7ea679 offered for a few problems changed by
issue 40) holds the specs an older tree offered, at their offered defaults, keyed ``problem|variant``; this tree
builds the same problems' specs now. In one worker pool (what ``kerngen bench`` does: every kernel fully checked
against PyTorch first, then timed with the L2 flushed, the median) each pair is evaluated ``--rounds`` times, old and
new in turns (old, new, new, old), and the best time of each kept. Prints a table last; ``--out DIR`` also writes
every number as JSON there. A case ``problem|variant*N`` gets N rounds (each spec checked on 4N input sets in 2N
evaluations: a rare wrong result shows). The header names the tree whose kerngen.agent was imported (a GPU host's
editable install may be another tree's). ``--record FILE --cases ...`` writes this tree's specs for those cases
instead (with ``--tree DIR``, another checkout's: laid out as scripts/playbook_job_hashes.py does). Not packaged: a
developer's tool.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kerngen.agent
from kerngen.agent.playbook import PlaybookProposer
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.pool.local import WorkerPool
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

BEFORE = Path(__file__).with_name("i40p_before.json.gz")
# the device copy of the tree carries KernelBench inside it; a checkout has it beside
KB = next((p for p in (Path("shared/kernelbench"), Path("../shared/kernelbench")) if p.is_dir()), Path("shared/kernelbench"))
# the variant that serves an old one now (matmul's bounds-checked "simple" GEMM is the predicated "tiled" one)
NOW = {"simple": "tiled"}
# the cases of i40p_before.json.gz, the most telling first (a time limit cuts the last)
ORDER = ("matmul|tiled", "level1/8_Matmul_with_irregular_shapes_.py|simple", "conv2d_wide|direct", "conv2d_wide|igemm",
         "attention|wgmma", "layernorm|coop", "layernorm|split", "level2/17_Conv2d_InstanceNorm_Divide.py|igemm",
         "matmul|tf32x3", "conv_relu_maxpool|fused")
CHECK = dict(seeds=2, budget_ms=80.0, timeout_s=120.0)


def _problem(name: str) -> ProblemRef | str:
    return str(KB / name) if name.endswith(".py") else ProblemRef(source=name)


def offered_now(key: str, renamed: dict[str, str] = NOW) -> tuple[ProblemRef | str, KernelSpec | str]:
    """The case's problem and the spec this tree offers for it (or why none)."""
    name, variant = key.split("|")
    variant = renamed.get(variant, variant)
    ref = _problem(name)
    prop = PlaybookProposer(load_problem(ref))
    offered = prop.offer.get(variant) if prop.offer is not None else None
    if offered is None:
        return ref, f"{variant} not offered now: {prop.reason[:160]}"
    return ref, offered.spec


def measure(pool: WorkerPool, key: str, old: KernelSpec, rounds: int = 1) -> dict:
    ref, new = offered_now(key)
    if isinstance(new, str):
        return {"case": key, "error": new}
    pref = ref if isinstance(ref, ProblemRef) else ProblemRef(source=ref)
    cands = [Candidate(spec=s) for _ in range(rounds) for s in (old, new, new, old)]
    results = pool.evaluate(pref, cands, EvalOptions(**CHECK))
    variant = key.split("|")[1]
    row = {"case": key, "old": old.name, "new": new.name, "variant_now": NOW.get(variant, variant)}
    for tag, picks in (("old", (0, 3)), ("new", (1, 2))):
        rs = [results[4 * r + i] for r in range(rounds) for i in picks]
        ok = [r.ms for r in rs if r.ok]
        row[f"{tag}_ms"] = min(ok) if ok else None
        row[f"{tag}_verdict"] = "ok" if len(ok) == len(rs) else "; ".join(f"{r.verdict.value}: {r.message[:120]}"
                                                                            for r in rs if not r.ok)
    print(f"{key}: {row}", flush=True)
    return row


def table(rows: list[dict], gpu: str) -> str:
    out = ["", f"GPU: {gpu}; ms (median, L2 flushed, the best of the turns)",
           "| case | old spec | old ms | new spec | new ms | both correct | new / old |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        case = r["case"].replace("|", ": ")  # a cell of the table
        if r.get("variant_now") and not r["case"].endswith("|" + r["variant_now"]):
            case += f" (now {r['variant_now']})"
        if r.get("rounds", 1) > 1:
            case += f" x{r['rounds']}"
        if "error" in r:
            out.append(f"| {case} | - | - | - | - | {r['error']} | - |")
            continue
        o, n = r["old_ms"], r["new_ms"]
        ratio = f"{n / o:.3f}" if o and n else "-"
        ok = "yes" if r["old_verdict"] == r["new_verdict"] == "ok" else f"old {r['old_verdict']}; new {r['new_verdict']}"
        out.append(f"| {case} | {r['old']} | {o if o is None else f'{o:.4f}'} | {r['new']} | "
                   f"{n if n is None else f'{n:.4f}'} | {ok[:200]} | {ratio} |")
    return "\n".join(out)


def record(path: Path, cases: list[str], tree: Path | None) -> int:
    """This tree's (or ``tree``'s) offered specs for ``cases`` into ``path`` (gzipped JSON)."""
    if tree is not None:  # run this script in that checkout laid out as its package (no GPU needed)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from playbook_job_hashes import layout

        with tempfile.TemporaryDirectory() as tmp:
            layout(tree.resolve(), Path(tmp))
            argv = [sys.executable, str(Path(__file__).resolve()), "--record", str(path.resolve()), "--cases",
                    ",".join(cases)]
            return subprocess.run(argv, env=dict(os.environ, PYTHONPATH=tmp), cwd=Path.cwd()).returncode
    specs = {}
    for key in cases:
        _, spec = offered_now(key, {})
        if isinstance(spec, str):
            print(f"{key}: {spec}", file=sys.stderr)
            return 1
        specs[key] = spec.model_dump(mode="json")
    path.write_bytes(gzip.compress(json.dumps(specs, sort_keys=True).encode(), mtime=0))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--budget-s", type=float, default=120.0, help="start no case past this")
    ap.add_argument("--before", type=Path, default=BEFORE, help="the older tree's specs (gzipped JSON)")
    ap.add_argument("--cases", default=",".join(ORDER), help="problem|variant keys, comma-separated, in this order")
    ap.add_argument("--rounds", type=int, default=1, help="turns of (old, new, new, old) per case")
    ap.add_argument("--record", type=Path, default=None, help="write the specs of --cases here instead of timing")
    ap.add_argument("--tree", type=Path, default=None, help="with --record: another checkout's specs")
    ap.add_argument("--tag", default="i40p", help="the JSON of --out is TAG_bench.json")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    rounds = {c.partition("*")[0]: int(c.partition("*")[2] or args.rounds) for c in cases}
    cases = list(rounds)
    if args.record is not None:
        return record(args.record, cases, args.tree)
    deadline = time.monotonic() + args.budget_s
    before = {k: KernelSpec.model_validate(v) for k, v in json.loads(gzip.decompress(args.before.read_bytes())).items()}
    rows = []
    with WorkerPool(timeout_s=600) as pool:
        tree = Path(kerngen.agent.__file__).resolve().parent.parent
        gpu = f"{pool.gpu_facts().name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, tree {tree}"
        print(f"GPU: {gpu}", flush=True)
        for key in cases:
            old = before[key]
            if old.arch_specific and pool.gpu_facts().arch != "sm_90":
                continue
            if time.monotonic() > deadline:
                rows.append({"case": key, "error": "skipped (time budget)"})
                continue
            try:
                rows.append({**measure(pool, key, old, rounds[key]), "rounds": rounds[key]})
            except Exception as exc:  # noqa: BLE001 - one case failing leaves the others measured
                rows.append({"case": key, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.tag}_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
