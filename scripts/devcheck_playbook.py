"""A developer's quick GPU bench of the playbook's kernels, outside the harness: each problem file
is loaded by kerngen's loader and recognised by the playbook; every variant (at its defaults and
at the configurations of ``--configs=FILE.json``) is compiled by the harness's compiler
(:func:`kerngen.harness.compile.compiler.compile_many`: sandboxed NVRTC, the same options and prelude as a
search), launched with cupy on torch tensors, compared with the reference and timed with CUDA
events (L2 flushed before each rep). Not part of the package; needs a GPU and cupy.

    python3 scripts/devcheck_playbook.py [--configs=scripts/devcheck_playbook_configs.json] \\
        [--arch=sm_90] tests/data/playbook/suite_gelu.py [...]

The real checks (anti-cheat, seeds, tolerances) are the harness's; this is a quick bench.
``--configs`` maps a problem file's stem -> variant -> a list of configurations.
"""

from __future__ import annotations

import json
import os
import sys


def launcher(cubin: bytes, plan_, tensors, torch, cp, np):
    """A function that runs the plan's steps (launches and memsets) on ``tensors``."""
    mod = cp.cuda.function.Module()
    mod.load(cubin)
    scratch = {s.name: torch.empty(s.size, dtype=getattr(torch, s.dtype), device="cuda") for s in plan_.scratch}
    env = dict(tensors)
    env.update(scratch)
    funcs = {}
    for launch in plan_.launches:
        f = mod.get_function(launch.kernel)
        if launch.shared_mem > 48 * 1024:
            cp.cuda.driver.funcSetAttribute(f.ptr, 8, launch.shared_mem)  # MAX_DYNAMIC_SHARED_SIZE_BYTES
        funcs[launch.kernel] = f
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def call():
        for st in plan_.steps:
            if hasattr(st, "kernel"):
                args = []
                for a in st.args:
                    if a.kind == "tensor":
                        args.append(np.uint64(env[a.name].data_ptr()))
                    elif a.kind == "int32":
                        args.append(np.int32(a.value))
                    elif a.kind == "int64":
                        args.append(np.int64(a.value))
                    else:
                        args.append(np.float32(a.value))
                funcs[st.kernel](st.grid, st.block, tuple(args), shared_mem=st.shared_mem, stream=stream)
            else:
                env[st.tensor].view(torch.uint8).fill_(st.value)

    return call


def bench(fn, torch, reps=30, flush=None):
    ts = []
    for i in range(reps + 3):
        if flush is not None:
            flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        if i >= 3:
            ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def _resources(compiled) -> str:
    ks = compiled.info.kernels
    return " ".join(f"{name}: {k.registers} regs, {k.spill_stores} B spilled" for name, k in ks.items())


def check_problem(path: str, configs: dict, arch: str, flush, rows: list) -> None:
    import cupy as cp
    import numpy as np
    import torch

    from kerngen.agent.playbook import explain, family_of
    from kerngen.expr import TensorFacts
    from kerngen.harness.spec import plan
    from kerngen.harness.compile.compiler import compile_many, job_for
    from kerngen.problems.load import load_problem

    p = load_problem(path)
    m = explain(p)
    fam = family_of(m)
    model = p.build_model("cuda", 0)
    dt = getattr(torch, m.x.dtype)
    model = model.to(dt) if dt != torch.float32 else model
    with torch.no_grad():
        for prm in model.parameters():  # non-trivial affine parameters
            prm.copy_(torch.randn_like(prm) * 0.5 + 1.0)
    inputs = p.make_inputs("cuda", 1)
    with torch.no_grad():
        ref = model(*inputs)
        t_eager = bench(lambda: model(*inputs), torch, flush=flush)
    tensors = {t.name: v for t, v in zip(m.inputs, inputs)}
    tensors.update(dict(model.named_parameters()))
    facts = {k: TensorFacts(tuple(v.shape)) for k, v in tensors.items()}
    facts["out"] = TensorFacts(tuple(ref.shape))
    tol = 1e-4 if m.x.dtype == "float32" else 1e-2

    todo = []  # (variant, resolved plan, compile job)
    for var in fam.variants:
        spec = fam.build(m, var)
        for cfg in [{}] + list(configs.get(p.name, {}).get(var, [])):
            try:
                rp = plan.resolve(spec, sizes={}, tensors=facts, config=cfg)
                todo.append((var, rp, job_for(spec, rp, arch)))
            except Exception as exc:  # noqa: BLE001 - a developer's report: say it and go on
                rows.append((p.name, var, cfg, f"resolve: {exc}"[:90]))
    compiled = compile_many([job for _, _, job in todo])
    for (var, rp, _), done in zip(todo, compiled):
        if isinstance(done, Exception):
            rows.append((p.name, var, rp.config, f"COMPILE ERROR {str(done)[:300]}"))
            continue
        out = torch.full_like(ref, float("nan"))
        tensors["out"] = out
        try:
            call = launcher(done.cubin, rp, tensors, torch, cp, np)
            call()
            torch.cuda.synchronize()
            err = (out.float() - ref.float()).abs()
            nbad = int((~(err <= tol + tol * ref.float().abs())).sum())
            rel = float((out.float() - ref.float()).norm() / ref.float().norm())
            t = bench(call, torch, flush=flush)
            rows.append((p.name, var, rp.config, f"{'OK ' if nbad == 0 else 'BAD'} bad={nbad} rel={rel:.1e} "
                         f"maxerr={float(err.max()):.1e} {t:.4f} ms eager {t_eager:.4f} ms x{t_eager / t:.2f} "
                         f"{_resources(done)}"))
        except Exception as exc:  # noqa: BLE001
            rows.append((p.name, var, rp.config, f"ERROR {str(exc)[:300]}"))
            torch.cuda.synchronize()


def main(paths: list[str], configs: dict | None = None, arch: str = "sm_90") -> None:
    import torch

    from kerngen.problems.torch_modes import strict_fp32

    strict_fp32()  # references in true fp32 (no TF32)
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    rows: list = []
    for path in paths:
        check_problem(path, configs or {}, arch, flush, rows)
        torch.cuda.empty_cache()
    for r in rows:
        print(*r)


if __name__ == "__main__":
    args = sys.argv[1:]
    cfg, arch = None, os.environ.get("KERNGEN_ARCH", "sm_90")
    while args and args[0].startswith("--"):
        opt, _, value = args.pop(0).partition("=")
        if opt == "--configs":
            with open(value) as f:
                cfg = json.load(f)
        elif opt == "--arch":
            arch = value
        else:
            sys.exit(f"unknown option {opt} (--configs=FILE.json, --arch=sm_XX)")
    main(args, cfg, arch)
