"""Issue 35: where the space-to-depth convolution's time goes on the suite conv2d (one H100/H200): per-kernel times
(torch.profiler over repeated plan runs: the x pre-pass, the weights' pre-pass, the main kernel) at a few
configurations, and each configuration's error against fp64 beside PyTorch fp32's. Prints a table last. Not packaged:
a developer's tool, run on the GPU host from the repository root (after scripts/device/setup.sh):

    python3 scripts/device/i35f_probe.py [CONFIG_JSON ...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.expr import TensorFacts
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.agent.gpu_runs import conv_fp64_errors  # noqa: E402 - the tests' fp64 reference

REPS = 30


def runner(spec, cfg: dict, tensors: dict):
    facts = {k: TensorFacts(tuple(v.shape)) for k, v in tensors.items()}
    resolved = plan.resolve(spec, sizes={}, tensors=facts, config=cfg)
    bound = dict(tensors)
    for s in resolved.scratch:
        bound[s.name] = torch.empty(s.size, device="cuda", dtype=getattr(torch, s.dtype))
    major, minor = torch.cuda.get_device_capability()
    compiled = compile_job(job_for(spec, resolved, f"sm_{major}{minor}"), cache=None)
    module = LoadedModule(compiled.cubin, [launch.kernel for launch in resolved.launches])
    return PlanRunner(module, resolved, bound, torch.cuda.current_stream())


def main() -> int:
    configs = [json.loads(a) for a in sys.argv[1:]] or [{}]
    p = load_problem("conv2d")
    m = explain(p)
    spec = family_of(m).build(m, "wgmma_s2d")
    model = p.build_model("cuda", 7)
    (x,) = p.make_inputs("cuda", 7)
    rows = []
    for cfg in configs:
        out = torch.empty_like(model.conv(x))
        tensors = {"x": x, "conv.weight": model.conv.weight, "conv.bias": model.conv.bias, "out": out}
        run = runner(spec, cfg, tensors)
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(REPS):
                run()
            torch.cuda.synchronize()
        per = defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name] += ev.device_time / 1000.0 / REPS  # us -> ms
        ours, theirs = conv_fp64_errors(p, lambda model_, x_: (run(), out)[1])
        rows.append((cfg, dict(per), ours, theirs))
        print(cfg, {k: round(v, 4) for k, v in per.items()}, ours, theirs, flush=True)
    print("\n| config | x pre-pass ms | w pre-pass ms | main ms | sum ms | rel err vs fp64 (torch fp32) |\n|---|---|---|---|---|---|")
    for cfg, per, ours, theirs in rows:
        xp = sum(v for k, v in per.items() if "xprep" in k)
        wp = sum(v for k, v in per.items() if "wprep" in k)
        mn = sum(v for k, v in per.items() if k == "conv_s2d")
        print(f"| {cfg} | {xp:.4f} | {wp:.4f} | {mn:.4f} | {xp + wp + mn:.4f} | {ours[1]:.3g} ({theirs[1]:.3g}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
