"""The lstm family's recurrences against cuDNN at problems/models/lstm.py's size (2 layers, input 256, hidden 512,
64 steps, batch 64), side by side in one process on one GPU (run by scripts/device/i34m.sh).

cuDNN: ``model.lstm(x)`` under true fp32 (the harness's reference settings) and under PyTorch's defaults (TF32
allowed in cuDNN's RNN). Ours, per variant at its default and for ``splitk`` at a sweep of configurations: the
region's whole plan (each layer's projection GEMM and recurrence) and each recurrence launch alone (the plan run once
first, so its gates are in place), all timed with kerngen's own timer (CUDA events, L2 flushed before every
repetition, median). Every configuration's output is compared with cuDNN's (max abs error, relative norm; the
harness's real check is the GPU tests'). The kernels compile in parallel first. Prints a table last; ``--out FILE``
also writes the rows as JSON. Not packaged: a developer's tool.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from kerngen.agent.playbook import family_of
from kerngen.agent.playbook.model_plan import plan_model
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner
from kerngen.harness.gpu.timing import L2Flusher, bench
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from kerngen.problems.torch_modes import pytorch_defaults, strict_fp32

PROBLEM = "problems/models/lstm.py"
# splitk at its default, then each change alone (the ones its constraints refuse are skipped, and said so)
SWEEP = [{}, {"KW": 4}, {"KW": 16}, {"NG": 1}, {"NG": 4}, {"JB": 8}, {"JB": 8, "KW": 16},
         {"JB": 16, "UJ": 1, "BR": 8}, {"JB": 8, "UJ": 1, "BR": 8}, {"JB": 4, "UJ": 1, "BR": 8},
         {"JB": 8, "UJ": 2, "BR": 4, "KW": 4, "NG": 4}, {"JB": 8, "UJ": 2, "BR": 8}, {"JB": 16, "UJ": 2, "BR": 8}]
OTHERS = [("persistent", {}), ("persistent", {"JB": 4, "BR": 1, "KC": 64}), ("persistent_ffma", {})]


def _compile(job):
    """A compiled plan, or why not (one line): one failing compile leaves the others."""
    try:
        return compile_job(job, cache=None)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:140]


def _ms(fn, stream, flusher) -> float:
    return bench(fn, stream=stream, flusher=flusher, budget_ms=60.0, warmup_ms=10.0, min_reps=20,
                 keep_samples=False).median_ms


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    strict_fp32()
    torch.manual_seed(0)
    problem = load_problem(PROBLEM)
    model = problem.build_model("cuda")
    (x,) = problem.make_inputs("cuda", 0)
    mp = plan_model(problem)
    rp = next(r for r in mp.regions if r.family == "lstm")
    m = rp.region.match
    facts = m.tensor_facts()
    params = dict(model.named_parameters())  # named as the region's tensors: lstm.weight_ih_l0, ...
    stream = torch.cuda.current_stream()
    flusher = L2Flusher("cuda")
    with torch.no_grad():
        want = model.lstm(x)[0]
        rows = [{"what": "cuDNN nn.LSTM, true fp32", "region_ms": _ms(lambda: model.lstm(x), stream, flusher)}]
        with pytorch_defaults():
            rows.append({"what": "cuDNN nn.LSTM, PyTorch defaults", "region_ms": _ms(lambda: model.lstm(x), stream,
                                                                                     flusher)})
        rows.append({"what": "whole model, eager", "region_ms": _ms(lambda: model(x), stream, flusher)})
    cudnn = rows[0]["region_ms"]
    print(f"GPU {torch.cuda.get_device_name()}: cuDNN {cudnn:.4f} ms (defaults {rows[1]['region_ms']:.4f}), "
          f"eager model {rows[2]['region_ms']:.4f} ms", flush=True)

    family = family_of(m)
    wanted = [("splitk", c) for c in SWEEP] + OTHERS
    built = []
    for variant, change in wanted:
        spec = family.build(m, variant)
        config = {**spec.default_config(), **change}
        label = f"{variant} " + (" ".join(f"{k}={v}" for k, v in change.items()) or "default")
        try:
            resolved = plan.resolve(spec, sizes={}, tensors=facts, config=config)
        except Exception as exc:  # noqa: BLE001 - a refused configuration is a row saying why
            rows.append({"what": label, "why": f"{type(exc).__name__}: {exc}"[:140]})
            continue
        built.append((label, spec, resolved))
    major, minor = torch.cuda.get_device_capability()
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as ex:
        compiled = list(ex.map(_compile, [job_for(s, r, f"sm_{major}{minor}") for _, s, r in built]))
    print(f"compiled {len(built)} plans in {time.monotonic() - t0:.0f} s", flush=True)
    for (label, spec, resolved), ck in zip(built, compiled):
        row = {"what": label, "config": dict(resolved.config)}
        try:
            if isinstance(ck, str):
                raise RuntimeError(ck)
            tensors = {"x": x, **{k: params[k].detach() for k in facts if k in params},
                       "out": torch.full_like(want, float("nan"))}
            for s in resolved.scratch:
                tensors[s.name] = torch.empty(s.size, device="cuda", dtype=getattr(torch, s.dtype))
            module = LoadedModule(ck.cubin, sorted({launch.kernel for launch in resolved.launches}))
            whole = PlanRunner(module, resolved, tensors, stream)
            whole()
            torch.cuda.synchronize()
            got = tensors["out"]
            row["max_err"] = (got - want).abs().max().item()
            row["rel_err"] = ((got - want).norm() / want.norm()).item()
            row["region_ms"] = _ms(whole, stream, flusher)
            rec = [PlanRunner(module, resolved.model_copy(update={"steps": [s]}), tensors, stream)
                   for s in resolved.launches if s.cooperative]
            row["recurrence_ms"] = sum(_ms(r, stream, flusher) for r in rec)
            row["regs"] = max(k.registers for n, k in ck.info.kernels.items() if "lstm" in n)
        except Exception as exc:  # noqa: BLE001 - one configuration failing leaves the others measured
            row["why"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:140]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    steps = m.facts.steps
    print()
    print(f"| recurrence at {PROBLEM} | region ms | vs cuDNN (fp32) | recurrence ms (2 layers) | us/step | "
          "max err | rel err | regs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "region_ms" not in r:
            print(f"| {r['what']} | - | - | - | - | - | - | {r.get('why', '')} |")
            continue
        rec = r.get("recurrence_ms")
        print(f"| {r['what']} | {r['region_ms']:.4f} | {cudnn / r['region_ms']:.2f}x | "
              + (f"{rec:.4f} | {1000 * rec / (2 * steps):.1f} | {r['max_err']:.1e} | {r['rel_err']:.1e} | "
                 f"{r['regs']} |" if rec is not None else "- | - | - | - | - |"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
