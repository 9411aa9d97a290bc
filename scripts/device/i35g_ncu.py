"""Issue 35: ncu of the space-to-depth convolution's main kernel on the suite conv2d (one H100/H200) at a few
configurations: tensor pipe, SM, L2 and DRAM throughput, the top stall reasons (kerngen's profile path,
harness/gpu/profile.py). Not packaged: a developer's tool, run from the repository root after
scripts/device/setup.sh:

    python3 scripts/device/i35g_ncu.py [CONFIG_JSON ...]
"""

from __future__ import annotations

import json
import sys

import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.profile import ProfileRequest, find_ncu, run_ncu
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef


def main() -> int:
    ncu = find_ncu()
    if ncu is None:
        print("no ncu on this host")
        return 1
    ref = ProblemRef(source=sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("{") else "conv2d")
    configs = [json.loads(a) for a in sys.argv[1:] if a.startswith("{")] or [{}]
    m = explain(load_problem(ref))
    spec = family_of(m).build(m, "wgmma_s2d")
    major, minor = torch.cuda.get_device_capability()
    for cfg in configs:
        resolved = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)
        compiled = compile_job(job_for(spec, resolved, f"sm_{major}{minor}"), cache=None)
        req = ProfileRequest(problem=ref, plan=resolved, cubin_b64=ProfileRequest.encode(compiled.cubin))
        out = run_ncu(ncu, req, device="0", arch=f"sm_{major}{minor}", timeout_s=150.0)
        if out.error:
            print(f"ncu {cfg}: {out.error}")
            continue
        for k in out.profiles:
            if k.name == "conv_s2d":
                print(f"ncu {cfg}: tensor {k.tensor_pct}%, SM {k.sm_pct}%, L2 {k.l2_pct}%, DRAM {k.dram_pct}%; stalls "
                      + ", ".join(f"{s.reason} {s.pct:.1f}%" for s in k.stalls) + f" | {k.line()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
