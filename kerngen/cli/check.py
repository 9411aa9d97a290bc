"""``kerngen check SPEC PROBLEM``: vet a kernel spec on any machine, GPU or not.

The static checks of the harness, in the order a search applies them, stopping at the first that
fails: the spec file is a valid :class:`~kerngen.harness.spec.spec.KernelSpec`; the problem loads (its
tensors are meta tensors: no GPU, no big memory); ``--config`` names tunables and values of the
spec; the launch plan resolves for the problem's sizes (every tensor it names exists; a
``tensormap`` argument's box fits its tensor's shape and dtype); the source
compiles through the normal compile boundary (:func:`kerngen.harness.compile.compiler.compile_job`:
the source policy, no tunable or define redefined in the source, the sandboxed NVRTC, forbidden
device state and the kernels the plan names); every launch passes as many
arguments as its kernel has parameters, each of the parameter's size (:mod:`.kparams`); the
compiled registers and shared memory fit a block of the target.

It prints each kernel's registers, spills and shared memory, and how many configurations of the
spec's tunables are admissible (:func:`kerngen.harness.tune.admissible.admissible`, the one resolution
the playbook uses too: the tuner's static pruning; with ``--compile-all`` every admissible one is
also compiled and checked like the chosen one).
With ``--emulate``, a spec that passes them is then run on the CPU emulator
(:mod:`kerngen.harness.emu`) through the harness's own correctness check, against PyTorch's
reference on the CPU, at the problem's shape (``--shape`` makes a built-in small enough): fresh
random inputs, poisoned and guarded outputs, runs before and after the reference. The emulator
compiles the spec's CUDA-C as host C++ and runs it on this machine, jailed (:mod:`kerngen.harness.emu.jail`):
it runs the spec the user names, never a model's answer.
Exit status 0 when every check passes, 1 when one fails (one line on stderr), 2 when the command
cannot run (the problem does not load, a bad option); ``--json`` prints one JSON object instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

import typer

from kerngen.text import one_line, strict_json
from kerngen.errors import KerngenError

ARCH_RE = re.compile(r"^sm_\d{2,3}[af]?$")
# the most input and output bytes --emulate takes on (one fiber per CUDA thread: a few million
# threads a second); beyond it, a smaller --shape
EMULATE_MAX_BYTES = 64 << 20


class CheckFailed(KerngenError):
    """A check the spec does not pass (exit status 1)."""

    exit_code = 1

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.message = message


def _arg_json(arg) -> dict[str, Any]:
    from kerngen.harness.spec.kparams import arg_bytes

    out: dict[str, Any] = {"kind": arg.kind, "bytes": arg_bytes(arg.kind)}
    if arg.kind == "tensor":
        out["name"] = arg.name
    elif arg.kind == "tensormap":
        out.update(name=arg.name, box=list(arg.box), swizzle=arg.swizzle)
        if not arg.full_width:  # a k-tile box (and a view): shown where used, older reports unchanged
            out["full_width"] = False
        if arg.view is not None:
            out["view"] = list(arg.view)
    else:
        out["value"] = arg.value
    return out


def _plan_json(plan) -> dict[str, Any]:
    from kerngen.harness.spec.plan import ResolvedLaunch

    steps = []
    for step in plan.steps:
        if isinstance(step, ResolvedLaunch):
            steps.append({"op": "launch", "kernel": step.kernel, "grid": list(step.grid), "block": list(step.block),
                          "shared_mem": step.shared_mem, "cooperative": step.cooperative,
                          "args": [_arg_json(a) for a in step.args]})
        else:
            steps.append({"op": "memset", "tensor": step.tensor, "value": step.value})
    return {"config": plan.config, "defines": plan.defines, "steps": steps,
            "scratch": [s.model_dump() for s in plan.scratch]}


def run_check(spec_path: str, problem: str, *, config: str | None = None, arch: str | None = None,
              shape: str | None = None, dtype: str | None = None, compile_all: bool = False,
              emulate: bool = False) -> dict[str, Any]:
    """The report of ``kerngen check`` as data. Raises :class:`KerngenError` when the command
    cannot run; a failed check is ``report["ok"] is False`` with ``stage`` and ``error``."""
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import parse_problem_ref

    from kerngen.cli.bench import parse_config
    from kerngen.harness.compile.compiler import compile_job, job_for
    from kerngen.harness.compile.nvrtc_info import default_arch
    from kerngen.errors import CompileError
    from kerngen.harness.spec.kparams import check_launch_args, params_table
    from kerngen.harness.spec.plan import resolve
    from kerngen.harness.tune.admissible import compile_stage, count_configs, limits_for
    from kerngen.harness.tune.prune import resource_reason
    from kerngen.harness.spec.spec import KernelSpec

    arch = (arch or default_arch()).strip()
    if not ARCH_RE.match(arch):
        raise KerngenError(f"bad --arch {arch!r}: expected sm_XY, e.g. sm_90")
    ref = parse_problem_ref(problem, shape=shape, dtype=dtype)
    info = load_problem(ref).info  # ProblemError: the command cannot run (exit 2)
    if emulate:
        _emulation_fits(info)
    gpu = limits_for(arch)
    report: dict[str, Any] = {
        "ok": False, "stage": None, "error": None, "spec": str(spec_path), "name": None, "problem": ref.label(),
        "arch": arch, "passed": [], "config": None, "plan": None, "compile": None, "kernels": {}, "configs": None,
        "emulated": None,
        "limits": {"max_threads_per_block": gpu.max_threads_per_block,
                   "max_shared_per_block_optin": gpu.max_shared_per_block_optin,
                   "regs_per_block": gpu.regs_per_block},
    }

    def fail(stage: str, message: str) -> dict[str, Any]:
        report["stage"], report["error"] = stage, one_line(message)
        return report

    def guarded(stage: str, fn):
        """Run one stage: its KerngenError (or anything a hostile spec provokes) is the verdict."""
        try:
            return True, fn()
        except CompileError as exc:
            return False, fail(compile_stage(str(exc)), str(exc))
        except KerngenError as exc:
            return False, fail(stage, str(exc))
        except (ArithmeticError, ValueError, TypeError, RecursionError, MemoryError) as exc:
            return False, fail(stage, f"{type(exc).__name__}: {exc}")

    # what the command line gets wrong is a usage error (exit 2), not a check the spec fails
    if not Path(spec_path).is_file():
        raise KerngenError(f"kernel spec not found: {spec_path}")
    wanted = parse_config(config)
    ok, spec = guarded("spec", lambda: KernelSpec.load(spec_path))
    if not ok:
        return report
    report["name"] = one_line(spec.name, 120)
    report["passed"].append("spec")
    ok, counted = guarded("configs", lambda: count_configs(spec, info, gpu, arch, compile_all))
    if ok:
        report["configs"] = counted
    else:  # counting is a report, not a check: say why it could not be done and go on
        report["configs"] = {"error": report["error"]}
        report["stage"] = report["error"] = None

    try:
        cfg = spec.full_config(wanted)
    except KerngenError as exc:  # --config names a tunable the spec lacks, or a value it does not offer
        raise KerngenError(f"--config does not fit {spec_path}: {exc} (its tunables: "
                           f"{', '.join(f'{k}={v}' for k, v in spec.tunables.items()) or 'none'})") from None
    report["config"] = cfg
    report["passed"].append("config")
    def the_plan():
        from kerngen.harness.gpu.tensormap import check_plan

        resolved = resolve(spec, sizes=info.sizes, tensors=info.tensor_facts(), config=cfg)
        known = {t.name: (t.shape, t.dtype) for t in info.tensors().values()}
        known.update({s.name: ((s.size,), s.dtype) for s in resolved.scratch})
        check_plan(resolved, known)  # tensormap arguments: what their tensors' shapes and dtypes allow
        return resolved

    ok, plan = guarded("plan", the_plan)
    if not ok:
        return report
    report["plan"] = _plan_json(plan)
    report["passed"].append("plan")
    ok, compiled = guarded("compile", lambda: compile_job(job_for(spec, plan, arch)))
    if not ok:
        return report
    report["passed"] += ["compile", "forbidden", "kernels"]
    ci = compiled.info
    report["compile"] = {"seconds": round(ci.seconds, 3), "cached": ci.cached, "nvrtc": ci.nvrtc_version,
                         "key": ci.key, "options": ci.options, "arch": ci.arch}
    params = params_table(compiled.cubin)
    for name in sorted(set(ci.kernels) | set(params)):
        entry: dict[str, Any] = ci.kernels[name].model_dump() if name in ci.kernels else {}
        entry["params"] = params.get(name)
        report["kernels"][name] = entry
    ok, _ = guarded("arguments", lambda: check_launch_args(compiled.cubin, plan, ci.log))
    if not ok:
        return report
    report["passed"].append("arguments")
    kind, reason = resource_reason(plan, ci, gpu)
    if kind:
        return fail("resources", f"{reason} ({arch})")
    report["passed"].append("resources")
    if emulate:
        ok, result = guarded("emulate", lambda: _emulate(ref, spec, plan))
        if not ok:
            return report
        report["emulated"] = {"verdict": result.verdict.value, "message": one_line(result.message, 1000),
                              "failed": result.check.failed.value if result.check and result.check.failed else None,
                              "seeds": result.check.seeds if result.check else [], "seconds": round(result.wall_s, 2)}
        if not result.ok:
            return fail("emulate", f"{result.verdict.value}: {result.message}")
        report["passed"].append("emulate")
    report["ok"] = True
    return report


def _emulation_fits(info) -> None:
    """--emulate on a problem small enough for the emulator, else a usage error (exit 2)."""
    from kerngen.harness.emu.runner import available, compiler

    if not available():
        raise KerngenError(f"--emulate needs a C++ compiler: {compiler()!r} is not on PATH (set KERNGEN_EMU_CXX)")
    total = sum(t.nbytes for t in info.inputs) + sum(t.nbytes for t in info.outputs)
    if total > EMULATE_MAX_BYTES:
        raise KerngenError(f"--emulate: {info.name} moves {total / 2**20:.0f} MiB, more than the emulator takes on "
                           f"({EMULATE_MAX_BYTES >> 20} MiB): give a built-in a smaller --shape, e.g. --shape 64x256")


def _emulate(ref, spec, plan):
    """The harness's correctness check of ``spec`` on the CPU emulator (not timed)."""
    import torch

    from kerngen.harness.emu.launch import evaluate_emulated
    from kerngen.harness.evaluator import EvalOptions
    from kerngen.harness.gpu.check import ProblemState
    from kerngen.problems.load import load_problem
    from kerngen.problems.torch_modes import strict_fp32

    strict_fp32()
    state = ProblemState(load_problem(ref), torch.device("cpu"))
    return evaluate_emulated(state, spec, plan, EvalOptions(seeds=3, bench=False, timeout_s=300.0))


# ----- printing -----------------------------------------------------------------------------
def _cfg_text(cfg: dict[str, int] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (cfg or {}).items()) or "(no tunables)"


def _arg_text(arg: dict[str, Any]) -> str:
    if arg["kind"] == "tensormap":
        tile = "" if arg.get("full_width", True) else " (k tile)"
        view = f" of view {'x'.join(map(str, arg['view']))}" if "view" in arg else ""
        return f"tensormap {arg['name']}{view} box {arg['box'][0]}x{arg['box'][1]}{tile} swizzle {arg['swizzle']}"
    return arg.get("name") or f"{arg['kind']} {arg['value']}"


def _print_report(report: dict[str, Any]) -> None:
    from rich.console import Console

    out = Console(highlight=False, soft_wrap=True)

    def say(text: str) -> None:  # plain text: no markup, no control sequences (names come from files)
        indent = len(text) - len(text.lstrip(" "))
        out.print(" " * indent + one_line(text, 1000), markup=False)

    name = f" ({report['name']})" if report.get("name") else ""
    say(f"check {one_line(report['spec'], 200)}{name} on {report['problem']} for {report['arch']}")
    if report.get("config") is not None:
        say(f"  config: {_cfg_text(report['config'])}")
    plan = report.get("plan")
    if plan:
        for i, step in enumerate(plan["steps"]):
            if step["op"] == "memset":
                say(f"  step {i}: memset {step['tensor']} = {step['value']}")
                continue
            args = ", ".join(_arg_text(a) for a in step["args"])
            sizes = ",".join(str(a["bytes"]) for a in step["args"])
            coop = " cooperative" if step["cooperative"] else ""
            say(f"  step {i}: {step['kernel']}{coop} grid {tuple(step['grid'])} block {tuple(step['block'])} "
                f"dynamic shared {step['shared_mem']} B; {len(step['args'])} args ({args}) of {sizes or '-'} bytes")
    comp = report.get("compile")
    if comp:
        how = "from the compile cache" if comp["cached"] else f"{comp['seconds']:.2f} s"
        target = f" for {comp['arch']}" if comp.get("arch") and comp["arch"] != report["arch"] else ""
        say(f"  compiled with NVRTC {comp['nvrtc']}{target} ({how})")
    for kname, k in report.get("kernels", {}).items():
        if "registers" in k:
            line = (f"  kernel {kname}: {k['registers']} registers, spills {k['spill_stores']} B stores / "
                    f"{k['spill_loads']} B loads, {k['shared_bytes']} B static shared, {k['stack_bytes']} B stack")
        else:
            line = f"  kernel {kname}: (no ptxas report)"
        if k.get("params") is not None:
            line += f"; {len(k['params'])} params of {','.join(map(str, k['params'])) or '-'} bytes"
        say(line)
    c = report.get("configs")
    if c and "error" not in c:
        how = "compiled and checked" if c.get("compiled") else "after static pruning"
        sample = f" (a sample of {c['enumerated']})" if c["sampled"] else ""
        say(f"  configurations: {c['admissible']} of {c['total']}{sample} admissible {how}")
        for kind, n in c["pruned"].items():
            say(f"    {n} pruned by {kind}, e.g. {c['examples'].get(kind, '')}")
        if not report["ok"] and c.get("first_admissible") and report.get("stage") in ("config", "plan", "resources"):
            say(f"    an admissible configuration: --config {_cfg_text(c['first_admissible'])}")
    elif c:
        say(f"  configurations: not counted ({c['error']})")
    emu = report.get("emulated")
    if emu:
        say(f"  emulated on the CPU against PyTorch: {emu['verdict']} ({emu['seconds']:.1f} s): {emu['message']}")
    if report["ok"]:
        say(f"ok: {', '.join(report['passed'])}")


def check_cmd(
    spec: Path = typer.Argument(..., help="kernel spec (JSON or YAML)"),
    problem: str = typer.Argument(..., help="built-in problem name or KernelBench-format .py file"),
    config: Optional[str] = typer.Option(None, "--config", help="tunables, e.g. BLOCK=256,VEC=4 (else the defaults)"),
    arch: Optional[str] = typer.Option(None, "--arch", help="target, e.g. sm_90 (default: $KERNGEN_ARCH, the "
                                       "visible GPU's, else sm_90)"),
    shape: Optional[str] = typer.Option(None, "--shape", help="built-ins: shape, e.g. 8192x1024"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="built-ins: fp32 | fp16 | bf16"),
    compile_all: bool = typer.Option(False, "--compile-all", help="compile and check every admissible "
                                     "configuration too (not only static pruning)"),
    emulate: bool = typer.Option(False, "--emulate", help="then run the spec on the CPU emulator through the "
                                 "harness's correctness check against PyTorch (a small --shape; needs g++; compiles "
                                 "and runs the spec's CUDA-C as host code, jailed: only for specs you trust to run)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Vet a kernel spec without a GPU: validate it, resolve its launch plan for PROBLEM, compile
    it in the sandbox, check kernel names and argument sizes against the compiled parameters;
    print registers, spills, shared memory and the admissible configurations. With --emulate, also
    run it on the CPU emulator through the harness's correctness check at a small shape."""
    try:
        report = run_check(str(spec), problem, config=config, arch=arch, shape=shape, dtype=dtype,
                           compile_all=compile_all, emulate=emulate)
    except KerngenError as exc:
        if as_json:
            typer.echo(json.dumps({"ok": False, "stage": "setup", "error": one_line(str(exc))}))
            raise typer.Exit(exc.exit_code) from None
        raise
    except Exception as exc:  # noqa: BLE001 - a check never ends in a traceback
        message = one_line(f"internal error: {type(exc).__name__}: {exc}")
        if as_json:
            typer.echo(json.dumps({"ok": False, "stage": "internal", "error": message}))
            raise typer.Exit(2) from None
        raise KerngenError(message) from None
    if as_json:
        typer.echo(json.dumps(strict_json(report), indent=2, default=str))
    else:
        _print_report(report)
    if not report["ok"]:
        if not as_json:
            raise CheckFailed(report["stage"], report["error"])
        raise typer.Exit(CheckFailed.exit_code)
