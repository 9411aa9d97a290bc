"""``kerngen export RUN --out DIR``: the best kernel of a run as files and a PyTorch op.

An export is data. It writes ``<name>.cu`` (the source), ``<name>.json``
(:class:`kerngen.results.manifest.ExportManifest`: the KernelSpec, its tuned configuration, the resolved
launch plan, the problem ref and its tensors' shapes and dtypes, the cubin's arch) and
``<name>.<arch>.cubin`` (NVRTC needs no GPU, so the cubin is compiled here, for the GPU the run
was measured on). ``kerngen.load(DIR)`` builds ``torch.ops.kerngen.<name>`` from those with
kerngen's own code (:mod:`kerngen.results.exported_op`) and imports nothing from the folder.

For convenience it also writes ``<name>.py`` (``templates/export_template.py.j2``): a docstring
and one call, ``op = kerngen.load(<its folder>)``, so ``import <name>`` works with the folder on
``sys.path``. It holds no logic of its own and kerngen never imports it; a ``.py`` in an export
folder from someone else is that person's code, to be read before it is imported by hand.

The problem's tensors and sizes come from the run's record (:mod:`kerngen.agent.problem_data`):
exporting a run never imports its problem file. Every file name is checked to stay inside
``--out`` (:mod:`kerngen.agent.safe_paths`), and the arch is checked before it reaches NVRTC.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from kerngen.version import __version__
from kerngen.agent.journal import DEMO_LABEL, write_atomic
from kerngen.agent.safe_paths import inside
from kerngen.errors import KerngenError
from kerngen.harness.results import Timing
from kerngen.harness.spec.spec import KernelSpec
from kerngen.results.manifest import ExportError, ExportManifest, check_arch
from kerngen.problems.ref import ProblemRef

if TYPE_CHECKING:
    from kerngen.problems.info import ProblemInfo

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
    """An ASCII Python (and torch.library) identifier from ``text``: ``conv.weight`` -> ``conv_weight``."""
    ident = re.sub(r"[^0-9A-Za-z_]", "_", str(text)).strip("_")[:100] or fallback
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
    """Text of a run or a problem, safe inside the generated module's docstring (one line, no
    quote or backslash, no control sequence)."""
    from kerngen.redact import printable

    return " ".join(printable(str(text)).split()).replace("\\", "/").replace('"', "'")


def _timing_line(timing: Timing | None, gpu: str) -> str:
    if timing is None:
        return ""
    return f"measured {timing.median_ms:.4f} ms (IQR {timing.iqr_ms:.4f} ms) on {_doc_safe(gpu) or 'its GPU'}"


def render_module(m: ExportManifest) -> str:
    """The convenience module of an export: a docstring and ``op = kerngen.load(<its folder>)``."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    shape = lambda t: ", ".join(str(d) for d in t.shape)  # noqa: E731
    text = env.get_template(TEMPLATE).render(
        name=m.name, label=_doc_safe(m.problem_label), origin=_doc_safe(m.origin),
        timing_line=_timing_line(m.timing, m.gpu), arch=m.arch, cubin_file=m.cubin_file, source_file=m.source_file,
        manifest_file=f"{m.name}.json",
        arguments=[{"arg": a, "name": _doc_safe(t.name), "dtype": _doc_safe(t.dtype), "shape": shape(t)}
                   for a, t in zip(m.arg_names, m.arguments)],
        outputs=[{"name": _doc_safe(o.name), "dtype": _doc_safe(o.dtype), "shape": shape(o)} for o in m.outputs],
        scalars=_doc_safe(", ".join(f"{k}={v}" for k, v in m.scalars.items())), arg_list=", ".join(m.arg_names),
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
    info: "ProblemInfo | None" = None,
    demo: bool = False,
) -> ExportResult:
    """Export ``spec`` at ``config`` for ``problem_ref`` into ``out_dir`` (created).

    ``info``: the problem as data (a run's record); without it the problem is loaded, which
    imports its file: only for a problem the caller names. ``demo``: a scripted demo's kernel (a
    toy): its default op name starts with ``demo_`` and its origin says so."""
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ExportError(f"--out {out_dir} is a file: an export is a folder (give a new or existing folder)")
    from kerngen.harness.compile.compiler import compile_job, job_for
    from kerngen.harness.compile.nvrtc_info import default_arch
    from kerngen.harness.spec.plan import resolve

    if info is None:
        from kerngen.problems.load import load_problem

        info = load_problem(problem_ref).info  # ProblemError for an unknown problem
    plan = resolve(spec, sizes=info.sizes, tensors=info.tensor_facts(), config=config)  # SpecError
    arch = check_arch(arch or default_arch())  # before it becomes an NVRTC option or a file name
    job = job_for(spec, plan, arch)
    compiled = compile_job(job)  # CompileError: a kernel that does not compile is not exported
    name = identifier(name) if name else ("demo_" if demo else "") + default_name(info.name, spec, plan.config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ref = info.ref
    manifest = ExportManifest(
        name=name, op=f"kerngen::{name}", problem=ref, problem_label=ref.label(),
        inputs=info.inputs, params=info.params, outputs=info.outputs,
        arg_names=arg_names([t.name for t in [*info.inputs, *info.params]]), scalars=info.scalars,
        spec=spec, config=plan.config, plan=plan, source_file=f"{name}.cu", kernels=job.kernels,
        nvrtc_options=job.options, arch=arch, cubin_file=f"{name}.{arch}.cubin",
        nvrtc_version=compiled.info.nvrtc_version, origin=origin or f"spec {spec.name}", timing=timing, gpu=gpu,
        kerngen_version=__version__,
    )
    module_text = render_module(manifest)
    # every file stays inside --out (names are identifiers, the arch is checked; a link is replaced, not followed)
    source = inside(out, manifest.source_file, "export file")
    cubin = inside(out, manifest.cubin_file, "export file")  # type: ignore[arg-type]
    manifest_path = inside(out, f"{name}.json", "export file")
    module = inside(out, f"{name}.py", "export file")
    write_atomic(source, spec.source)
    write_atomic(cubin, compiled.cubin)  # type: ignore[arg-type]
    write_atomic(manifest_path, manifest.model_dump_json(indent=2) + "\n")
    write_atomic(module, module_text)
    return ExportResult(name=name, op=manifest.op, dir=out, manifest=manifest_path, module=module, source=source,
                        cubin=cubin)


def export_run(run: Any, out_dir: str | Path, *, runs_dir: str | Path = "runs", name: str | None = None,
               arch: str | None = None) -> ExportResult:
    """Export the best kernel of ``run`` (a loaded Run, a run folder or a run id). The cubin is
    compiled for the arch of the GPU the run was measured on, unless ``arch`` is given. The
    problem comes from the run's record (never from importing its problem file)."""
    from kerngen.agent.problem_data import recorded_info
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
        info = recorded_info(run.started)
        demo = run.started.demo
        origin = (f"{DEMO_LABEL}, a toy kernel: " if demo else "") + f"run {run.id} node #{best.id}"
        return export_spec(spec, best.config, run.started.problem, out_dir, name=name, demo=demo,
                           arch=arch or (gpu.arch if gpu else None), origin=origin,
                           timing=result.timing if result is not None else None, gpu=gpu.name if gpu else "",
                           info=info)
    except KerngenError as exc:
        raise type(exc)(f"run {run.id} node #{best.id}: {exc}") from None
