"""``kerngen export RUN --out DIR``: the best kernel of a run as files and a PyTorch op.

Writes ``<name>.cu`` (the source), ``<name>.json`` (:class:`kerngen.load.ExportManifest`: the
KernelSpec, its tuned configuration, the resolved launch plan, the problem ref and its tensors'
shapes and dtypes, the cubin's arch), ``<name>.<arch>.cubin`` (NVRTC needs no GPU, so the cubin
is compiled here, for the GPU the run was measured on) and ``<name>.py``, generated from
``templates/export_template.py.j2``: it registers ``torch.ops.kerngen.<name>`` with
``torch.library.custom_op`` and a ``register_fake``. See :mod:`kerngen.load` for the runtime.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kerngen.agent.journal import write_atomic
from kerngen.harness.errors import KerngenError
from kerngen.harness.results import Timing
from kerngen.harness.spec import KernelSpec
from kerngen.load import ExportError, ExportManifest
from kerngen.problems.ref import ProblemRef

TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE = "export_template.py.j2"


class ExportResult(BaseModel):
    name: str
    op: str
    dir: Path
    manifest: Path
    module: Path
    source: Path
    cubin: Path | None = None

    def files(self) -> list[Path]:
        return [p for p in (self.source, self.manifest, self.cubin, self.module) if p is not None]


def identifier(text: str, fallback: str = "x") -> str:
    """A Python (and torch.library) identifier from ``text``: ``conv.weight`` -> ``conv_weight``."""
    ident = re.sub(r"\W", "_", text).strip("_") or fallback
    if ident[0].isdigit():
        ident = f"_{ident}"
    return f"{ident}_" if keyword.iskeyword(ident) or ident == "self" else ident


def arg_names(names: list[str]) -> list[str]:
    """Distinct identifiers for the op's arguments, in order."""
    out: list[str] = []
    for n in names:
        ident = identifier(n, "arg")
        while ident in out:
            ident += "_"
        out.append(ident)
    return out


def default_name(problem_name: str, spec: KernelSpec, config: dict[str, int]) -> str:
    """``<problem>_<hash>``: the hash covers spec and config, so two different kernels never
    claim the same op name in one process."""
    import hashlib

    digest = hashlib.sha256(f"{spec.content_hash()}{sorted(config.items())}".encode()).hexdigest()[:8]
    return f"{identifier(problem_name.lower(), 'kernel')[:40]}_{digest}"


def _doc_safe(text: str) -> str:
    return " ".join(str(text).split()).replace("\\", "/").replace('"""', "'''")


def _timing_line(timing: Timing | None, gpu: str) -> str:
    if timing is None:
        return ""
    return f"measured {timing.median_ms:.4f} ms (IQR {timing.iqr_ms:.4f} ms) on {_doc_safe(gpu) or 'its GPU'}"


def render_module(m: ExportManifest) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    n_out = len(m.outputs)
    returns = "torch.Tensor" if n_out == 1 else f"tuple[{', '.join(['torch.Tensor'] * n_out)}]"
    shape = lambda t: ", ".join(str(d) for d in t.shape)  # noqa: E731
    text = env.get_template(TEMPLATE).render(
        name=m.name, label=_doc_safe(m.problem_label), origin=_doc_safe(m.origin),
        timing_line=_timing_line(m.timing, m.gpu), arch=m.arch, cubin_file=m.cubin_file, source_file=m.source_file,
        arguments=[{"arg": a, "name": _doc_safe(t.name), "dtype": t.dtype, "shape": shape(t)}
                   for a, t in zip(m.arg_names, m.arguments)],
        outputs=[{"name": o.name, "dtype": o.dtype, "shape": shape(o)} for o in m.outputs],
        scalars=_doc_safe(", ".join(f"{k}={v}" for k, v in m.scalars.items())),
        typed_args=", ".join(f"{a}: torch.Tensor" for a in m.arg_names), arg_list=", ".join(m.arg_names),
        returns=returns,
    )
    compile(text, f"{m.name}.py", "exec")  # a template bug must fail here, not at the user's import
    return text


def export_spec(
    spec: KernelSpec,
    config: dict[str, int] | None,
    problem_ref: ProblemRef | str,
    out_dir: str | Path,
    *,
    name: str | None = None,
    arch: str | None = None,
    origin: str = "",
    timing: Timing | None = None,
    gpu: str = "",
) -> ExportResult:
    """Export ``spec`` at ``config`` for ``problem_ref`` into ``out_dir`` (created)."""
    import kerngen
    from kerngen.harness.compile import compile_job, default_arch, job_for
    from kerngen.harness.plan import resolve
    from kerngen.problems.problem import load_problem

    problem = load_problem(problem_ref)  # ProblemError for an unknown problem
    info = problem.info
    plan = resolve(spec, sizes=info.sizes, tensors=info.tensor_facts(), config=config)  # SpecError
    arch = arch or default_arch()
    job = job_for(spec, plan, arch)
    compiled = compile_job(job)  # CompileError: a kernel that does not compile is not exported
    name = identifier(name) if name else default_name(info.name, spec, plan.config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = ExportManifest(
        name=name, op=f"kerngen::{name}", problem=problem.ref, problem_label=problem.ref.label(),
        inputs=info.inputs, params=info.params, outputs=info.outputs,
        arg_names=arg_names([t.name for t in [*info.inputs, *info.params]]), scalars=info.scalars,
        spec=spec, config=plan.config, plan=plan, source_file=f"{name}.cu", kernels=job.kernels,
        nvrtc_options=job.options, arch=arch, cubin_file=f"{name}.{arch}.cubin",
        nvrtc_version=compiled.info.nvrtc_version, origin=origin or f"spec {spec.name}", timing=timing, gpu=gpu,
        kerngen_version=kerngen.__version__,
    )
    module_text = render_module(manifest)
    write_atomic(out / manifest.source_file, spec.source)
    (out / manifest.cubin_file).write_bytes(compiled.cubin)  # type: ignore[operator]
    write_atomic(out / f"{name}.json", manifest.model_dump_json(indent=2) + "\n")
    write_atomic(out / f"{name}.py", module_text)
    return ExportResult(name=name, op=manifest.op, dir=out, manifest=out / f"{name}.json",
                        module=out / f"{name}.py", source=out / manifest.source_file,
                        cubin=out / manifest.cubin_file)  # type: ignore[operator]


def export_run(run: Any, out_dir: str | Path, *, runs_dir: str | Path = "runs", name: str | None = None,
               arch: str | None = None) -> ExportResult:
    """Export the best kernel of ``run`` (a loaded Run, a run folder or a run id). The cubin is
    compiled for the arch of the GPU the run was measured on, unless ``arch`` is given."""
    from kerngen.agent.tree import Run, load_run

    if not isinstance(run, Run):
        run = load_run(run, runs_dir)
    best = run.best
    spec = best.best_spec() if best is not None else None
    if best is None or spec is None:
        raise ExportError(f"run {run.id} has no correct kernel to export")
    result = best.best_result
    gpu = run.tree.gpu
    try:
        return export_spec(spec, best.config, run.started.problem, out_dir, name=name,
                           arch=arch or (gpu.arch if gpu else None), origin=f"run {run.id} node #{best.id}",
                           timing=result.timing if result is not None else None, gpu=gpu.name if gpu else "")
    except KerngenError as exc:
        raise type(exc)(f"run {run.id} node #{best.id}: {exc}") from None
