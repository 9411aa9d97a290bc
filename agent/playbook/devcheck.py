"""GPU check of the playbook's kernels without the harness (for developers): compile with NVRTC,
launch with cupy on torch tensors, compare with the reference, time with CUDA events (L2
flushed before each rep). ``python -m kerngen.agent.playbook.devcheck FILE.py [...]``.
The real checks (anti-cheat, seeds, tolerances) are the harness's; this is a quick bench."""

from __future__ import annotations

import re
import sys
import time


def compile_cubin(src: str, defines: dict, arch: str = "sm_90") -> tuple[bytes, str]:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"k.cu", 0, [], [])
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"--ptxas-options=-v"]
    opts += [f"-D{k}={v}".encode() for k, v in defines.items()]
    r = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, n = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * n
    nvrtc.nvrtcGetProgramLog(prog, log)
    if r[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(log.decode(errors="replace"))
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, buf)
    return buf, log.decode(errors="replace")


def run_spec(spec, plan_, tensors, torch, cp, np):
    cubin, log = compile_cubin(spec.source, {**plan_.config, **plan_.defines})
    mod = cp.cuda.function.Module()
    mod.load(cubin)
    scratch = {s.name: torch.empty(s.size, dtype=getattr(torch, s.dtype), device="cuda") for s in plan_.scratch}
    env = dict(tensors)
    env.update(scratch)
    funcs = {}
    for l in plan_.launches:
        f = mod.get_function(l.kernel)
        if l.shared_mem > 48 * 1024:
            cp.cuda.driver.funcSetAttribute(f.ptr, 8, l.shared_mem)  # MAX_DYNAMIC_SHARED_SIZE_BYTES
        funcs[l.kernel] = f
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)  # noqa

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

    regs = re.findall(r"Function properties for (\w+)\n.*?\n.*?Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    return call, (regs, spills)


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


def main(paths: list[str], configs: dict | None = None) -> None:
    import cupy as cp
    import numpy as np
    import torch

    from kerngen.harness import plan
    from kerngen.expr import TensorFacts

    from . import builders, families, kbfile

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    rows = []
    for path in paths:
        p = kbfile.load(path)
        m = families.explain(p)
        model = p.build_model("cuda", 0)
        dt = getattr(torch, m.x.dtype)
        model = model.to(dt) if dt != torch.float32 else model
        with torch.no_grad():
            for prm in model.parameters():  # non-trivial affine parameters
                prm.copy_(torch.randn_like(prm) * 0.5 + 1.0)
        inputs = [t.to("cuda") for t in p.make_inputs("cpu", 1)]
        with torch.no_grad():
            ref = model(*inputs)
            t_eager = bench(lambda: model(*inputs), torch, flush=flush)
        tensors = {t.name: v for t, v in zip(m.inputs, inputs)}
        tensors.update(dict(model.named_parameters()))
        facts = {k: TensorFacts(tuple(v.shape)) for k, v in tensors.items()}
        facts["out"] = TensorFacts(tuple(ref.shape))
        tol = 1e-4 if m.x.dtype == "float32" else 1e-2
        for var in builders.VARIANTS[m.family]:
            spec = builders.build(m, var)
            cfgs = [{}] + list((configs or {}).get(p.name, {}).get(var, []))
            for cfg in cfgs:
                try:
                    rp = plan.resolve(spec, sizes={}, tensors=facts, config=cfg)
                except Exception as exc:
                    rows.append((p.name, var, cfg, f"resolve: {exc}"[:90]))
                    continue
                out = torch.full_like(ref, float("nan"))
                tensors["out"] = out
                try:
                    call, info = run_spec(spec, rp, tensors, torch, cp, np)
                    call()
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs()
                    bad = ~(err <= tol + tol * ref.float().abs())
                    nbad = int(bad.sum())
                    rel = float((out.float() - ref.float()).norm() / ref.float().norm())
                    t = bench(call, torch, flush=flush)
                    rows.append((p.name, var, rp.config, f"{'OK ' if nbad == 0 else 'BAD'} bad={nbad} rel={rel:.1e} "
                                 f"maxerr={float(err.max()):.1e} {t:.4f} ms eager {t_eager:.4f} ms x{t_eager / t:.2f} {info}"))
                except Exception as exc:
                    rows.append((p.name, var, cfg, f"ERROR {str(exc)[:300]}"))
                    torch.cuda.synchronize()
        del inputs, ref, model, tensors
        torch.cuda.empty_cache()
    for r in rows:
        print(*r)


if __name__ == "__main__":
    import json
    args = sys.argv[1:]
    cfg = None
    if args and args[0].startswith("--configs="):
        cfg = json.loads(open(args[0].split("=", 1)[1]).read())
        args = args[1:]
    main(args, cfg)
