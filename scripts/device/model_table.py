"""The region table of a model run (``kerngen generate M.py --as-model``), for the device scripts:
``python3 scripts/device/model_table.py RUNS_DIR MODEL`` prints the newest ``*-MODEL-model`` run's regions (share
of eager time, eager / kernel / floor ms, chosen or why not, every variant and configuration tried), whether it is
correct end to end, its share of eager time on kerngen kernels, and eager / torch.compile / kerngen ms."""

import sys
from pathlib import Path

from kerngen.agent.model_run import read_model_run

found = sorted(Path(sys.argv[1]).glob(f"*-{sys.argv[2]}-model"))
if not found or not (found[-1] / "model.json").is_file():
    print(f"no {sys.argv[2]} model run")
    sys.exit(0)
r = read_model_run(found[-1])


def f(v):
    return f"{v:.4f}" if v is not None else "-"


print("| region | nodes | family | variant | share of eager | eager ms | kernel ms | floor ms | chosen | why / config |")
print("|---|---|---|---|---|---|---|---|---|---|")
for g in r.regions:
    print(f"| r{g.region} | {', '.join(g.nodes)[:40]} | {g.family or '-'} | {g.variant or '-'} | {100 * g.share:.1f}% | "
          f"{f(g.eager_ms)} | {f(g.kernel_ms)} | {f(g.floor_ms)} | {g.chosen} | {(g.why or str(g.config))[:80]} |")
    for v in g.tried:
        print(f"|  | try {v.variant} | | | | | {f(v.kernel_ms)} | | {'ok' if v.ok else 'FAIL'} | "
              f"{(str(v.config) if v.config else '') + ' ' + v.message[:100]} |")
t = r.timing
print()
print(f"{sys.argv[2]}: correct end to end: {'yes' if r.check and r.check.ok else 'NO'} "
      f"({r.check.message[:200] if r.check else '-'}); share of eager time on kerngen kernels: {100 * r.kernel_share:.1f}%")
if t:
    print(f"eager {f(t.eager_ms)} ms, torch.compile {f(t.compile_ms)} ms, kerngen {f(t.kerngen_ms)} ms, "
          f"kerngen + compile {f(t.kerngen_compile_ms)} ms; device {r.device}")
