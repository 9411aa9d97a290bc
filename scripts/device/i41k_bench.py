"""Split-K for the wgmma convolution (run by scripts/device/i41k.sh; sm_90 only): ResNet18's late conv regions
(batch 16, conv + eval batch norm [+ residual] [+ ReLU], as the model run cuts them: r12-r20) written as problem
files, then in one worker pool (what ``kerngen bench`` and the model run's region search use: every kernel fully
checked against PyTorch first, then timed with the L2 flushed, the median): PyTorch eager (true fp32: TF32 off,
cuDNN), the conv_epi ``wgmma`` variant at today's default (``SPLIT_K`` 1: the one-launch spec main offers), at the
new filling default, at split-K 2 / 4 / 8 and at one consumer (CWG 1, r19's winner); torch.compile where time is
left. Prints a table last; ``--out DIR`` also writes the numbers as JSON. Not packaged: a developer's tool.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.pool.local import WorkerPool
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

# region: (cin, cout, k, stride, input hw, residual, relu) of resnet18.py's regions (tests/harness model plan)
REGIONS = {"r12": (256, 256, 3, 1, 14, False, False), "r13": (128, 256, 1, 2, 28, True, True),
           "r15": (256, 256, 3, 1, 14, True, True), "r16": (256, 512, 3, 2, 14, False, True),
           "r17": (512, 512, 3, 1, 7, False, False), "r18": (256, 512, 1, 2, 14, True, True),
           "r19": (512, 512, 3, 1, 7, False, True), "r20": (512, 512, 3, 1, 7, True, True)}
SOURCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d({cin}, {cout}, {k}, stride={stride}, padding={pad}, bias=False)
        self.bn = nn.BatchNorm2d({cout})
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x{res_arg}):
        return {body}


def get_inputs():
    return [torch.randn(16, {cin}, {hw}, {hw}){res_in}]


def get_init_inputs():
    return []
'''
CONFIGS = [("today", {"SPLIT_K": 1}), ("new default", {}), ("split 2", {"SPLIT_K": 2}), ("split 4", {"SPLIT_K": 4}),
           ("split 8", {"SPLIT_K": 8}), ("CWG 1", {"SPLIT_K": 1, "CWG": 1})]
CHECK = EvalOptions(seeds=2, budget_ms=60.0, timeout_s=90.0)


def write(folder: Path, name: str) -> Path:
    cin, cout, k, stride, hw, res, relu = REGIONS[name]
    oh = (hw + 2 * (k // 2) - k) // stride + 1
    # the downsample's region adds the block's own branch first (r + down(x)), the second conv's adds the identity
    body = ("r + self.bn(self.conv(x))" if k == 1 else "self.bn(self.conv(x)) + r") if res else "self.bn(self.conv(x))"
    body = f"torch.relu({body})" if relu else body
    path = folder / f"{name}.py"
    path.write_text(SOURCE.format(cin=cin, cout=cout, k=k, stride=stride, pad=k // 2, hw=hw, body=body,
                                  res_arg=", r" if res else "", res_in=f", torch.randn(16, {cout}, {oh}, {oh})" if res else ""))
    return path


def measure(pool: WorkerPool, name: str, folder: Path) -> dict:
    ref = ProblemRef(source=str(write(folder, name)))
    m = explain(load_problem(ref))
    base = pool.baseline(ref, budget_ms=100.0, with_compile=False)
    row = {"region": name, "family": m.family, "eager_ms": base.eager.median_ms, "compile_ms": None, "tried": {}}
    fam = family_of(m)
    cands, labels = [], []
    for label, asked in CONFIGS:
        defaults = {k: v for k, v in asked.items() if k == "SPLIT_K"}  # SPLIT_K picks the spec, the rest configures it
        cfg = {k: v for k, v in asked.items() if k != "SPLIT_K"}
        try:  # a split the shape refuses (an empty slice) is skipped, with the reason
            spec = fam.build(m, "wgmma", defaults)
            plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)
        except Exception as exc:  # noqa: BLE001 - not admitted at this shape
            row["tried"][label] = {"ms": None, "why": f"not admitted: {str(exc)[:100]}"}
            continue
        cands.append(Candidate(spec=spec, config=cfg))
        labels.append(label)
        if label == "new default":
            row["default_config"] = spec.default_config()
    for label, res in zip(labels, pool.evaluate(ref, cands, CHECK)):
        row["tried"][label] = {"ms": res.ms if res.ok else None, "why": "" if res.ok else
                               f"{res.verdict.value}: {res.message[:120]}"}
    print(f"{name}: eager {row['eager_ms']:.4f} ms; " + "; ".join(
        f"{k} {v['ms']:.4f}" if v["ms"] else f"{k} {v['why']}" for k, v in row["tried"].items()), flush=True)
    return row


def table(rows: list[dict]) -> str:
    heads = [label for label, _ in CONFIGS]
    out = ["", "ms (median, L2 flushed; every kernel checked first); eager = PyTorch true fp32 (cuDNN, TF32 off); "
           "ratio = eager / best wgmma",
           "| region | eager | compile | " + " | ".join(heads) + " | best | eager/best | new default |",
           "|---" * (len(heads) + 6) + "|"]
    for r in rows:
        ms = {k: v["ms"] for k, v in r["tried"].items() if v["ms"]}
        best = min(ms, key=ms.get) if ms else None
        cells = [f"{ms[h]:.4f}" if h in ms else "-" for h in heads]
        comp = f"{r['compile_ms']:.4f}" if r["compile_ms"] else "-"
        ratio = f"{r['eager_ms'] / ms[best]:.2f}x" if best else "-"
        d = r.get("default_config", {})
        new = f"SPLIT_K {d.get('SPLIT_K', 1)} CWG {d.get('CWG')} BN {d.get('BN')}"
        out.append(f"| {r['region']} | {r['eager_ms']:.4f} | {comp} | " + " | ".join(cells) +
                   f" | {best or '-'} | {ratio} | {new} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--budget-s", type=float, default=170.0, help="start nothing past this (a table still comes)")
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    if torch.cuda.get_device_capability() != (9, 0):
        print(f"needs an sm_90 GPU; this is {torch.cuda.get_device_name()}", file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(timeout_s=600) as pool:
        print(f"GPU: {pool.gpu_facts().name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        for name in REGIONS:
            if time.monotonic() > deadline - 15:
                print(f"{name}: skipped (time budget)", flush=True)
                continue
            try:
                rows.append(measure(pool, name, Path(tmp)))
            except Exception as exc:  # noqa: BLE001 - one region failing leaves the others measured
                print(f"{name}: failed: {type(exc).__name__}: {exc}", flush=True)
        for r in rows:  # torch.compile last, while time is left (its compile takes most of a baseline)
            if time.monotonic() > deadline - 20:
                break
            try:
                ref = ProblemRef(source=str(Path(tmp) / f"{r['region']}.py"))
                got = pool.baseline(ref, budget_ms=100.0, with_compile=True)
                r["compile_ms"] = got.compiled.median_ms if got.compiled else None
            except Exception as exc:  # noqa: BLE001
                print(f"{r['region']} torch.compile: failed: {exc}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "i41k_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
