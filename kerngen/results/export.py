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

import json
import keyword
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from kerngen.version import __version__
from kerngen.agent.journal import DEMO_LABEL, write_atomic
from kerngen.agent.safe_paths import inside
from kerngen.errors import KerngenError
from kerngen.harness.results import Timing
from kerngen.harness.spec.spec import KernelSpec
from kerngen.results.manifest import ExportError, ExportManifest, KernelVariant, check_arch
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
    buckets: int = 0  # shape buckets beside the first
    extra: list[Path] = []  # their sources and cubins

    def files(self) -> list[Path]:
        return [p for p in (self.source, self.manifest, self.cubin, self.module) if p is not None] + self.extra


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
        precision="true fp32" if m.precision == "fp32" else "TF32 (--precision tf32)", buckets=len(m.buckets),
    )
    compile(text, f"{m.name}.py", "exec")  # a template bug must fail here, not at the user's import
    return text


def _variant(spec: KernelSpec, config: dict[str, int] | None, info: "ProblemInfo", arch: str, stem: str, *,
             origin: str, timing: Timing | None, gpu: str,
             tolerance: tuple[float, float] | None = None) -> tuple[KernelVariant, bytes]:
    """One kernel of an export at the shapes of ``info``: its record and its cubin."""
    from kerngen.harness.compile.compiler import compile_job, job_for
    from kerngen.harness.spec.plan import resolve

    plan = resolve(spec, sizes=info.sizes, tensors=info.tensor_facts(), config=config)  # SpecError
    job = job_for(spec, plan, arch)
    compiled = compile_job(job)  # CompileError: a kernel that does not compile is not exported
    variant = KernelVariant(
        inputs=info.inputs, params=info.params, outputs=info.outputs, spec=spec, config=plan.config, plan=plan,
        source_file=f"{stem}.cu", kernels=job.kernels, nvrtc_options=job.options, arch=arch,
        cubin_file=f"{stem}.{arch}.cubin", nvrtc_version=compiled.info.nvrtc_version, origin=origin,
        timing=timing, gpu=gpu, sizes=info.sizes, atol=(tolerance or (info.atol, info.rtol))[0],
        rtol=(tolerance or (info.atol, info.rtol))[1])
    return variant, compiled.cubin  # type: ignore[return-value]


def _write_variant(out: Path, variant: KernelVariant, cubin: bytes) -> tuple[Path, Path]:
    # every file stays inside --out (names are identifiers, the arch is checked; a link is replaced, not followed)
    source = inside(out, variant.source_file, "export file")
    cubin_path = inside(out, variant.cubin_file, "export file")  # type: ignore[arg-type]
    write_atomic(source, variant.spec.source)
    write_atomic(cubin_path, cubin)  # type: ignore[arg-type]
    return source, cubin_path


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
    more: "list[BucketSource] | None" = None,
    tolerance: tuple[float, float] | None = None,
) -> ExportResult:
    """Export ``spec`` at ``config`` for ``problem_ref`` into ``out_dir`` (created).

    ``info``: the problem as data (a run's record); without it the problem is loaded, which
    imports its file: only for a problem the caller names. ``demo``: a scripted demo's kernel (a
    toy): its default op name starts with ``demo_`` and its origin says so. ``more``: the kernels of
    further shape buckets of the same problem (:func:`export_runs`)."""
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ExportError(f"--out {out_dir} is a file: an export is a folder (give a new or existing folder)")
    from kerngen.harness.compile.nvrtc_info import default_arch
    from kerngen.harness.spec.plan import resolve

    if info is None:
        from kerngen.problems.load import load_problem

        info = load_problem(problem_ref).info  # ProblemError for an unknown problem
    arch = check_arch(arch or default_arch())  # before it becomes an NVRTC option or a file name
    plan = resolve(spec, sizes=info.sizes, tensors=info.tensor_facts(), config=config)  # SpecError
    name = identifier(name) if name else ("demo_" if demo else "") + default_name(info.name, spec, plan.config)
    first, cubin = _variant(spec, config, info, arch, name, origin=origin or f"spec {spec.name}",
                            timing=timing, gpu=gpu, tolerance=tolerance)
    buckets = [_variant(b.spec, b.config, b.info, arch, f"{name}.b{i + 1}", origin=b.origin, timing=b.timing,
                        gpu=b.gpu, tolerance=b.tolerance) for i, b in enumerate(more or [])]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ref = info.ref
    manifest = ExportManifest(
        **{k: getattr(first, k) for k in KernelVariant.model_fields},
        name=name, op=f"kerngen::{name}", problem=ref, problem_label=ref.label(),
        arg_names=arg_names([t.name for t in [*info.inputs, *info.params]]), scalars=info.scalars,
        forward_args=list(info.args), precision=ref.precision or "fp32", buckets=[b[0] for b in buckets],
        kerngen_version=__version__,
    )
    module_text = render_module(manifest)
    manifest_path = inside(out, f"{name}.json", "export file")
    module = inside(out, f"{name}.py", "export file")
    source, cubin_path = _write_variant(out, first, cubin)
    extra = [p for variant, bucket_cubin in buckets for p in _write_variant(out, variant, bucket_cubin)]
    write_atomic(manifest_path, manifest.model_dump_json(indent=2) + "\n")
    write_atomic(module, module_text)
    return ExportResult(name=name, op=manifest.op, dir=out, manifest=manifest_path, module=module, source=source,
                        cubin=cubin_path, buckets=len(buckets), extra=extra)


@dataclass
class BucketSource:
    """A kernel of a further shape bucket, from its run's record."""

    spec: KernelSpec
    config: dict[str, int]
    info: Any  # ProblemInfo
    origin: str
    timing: Timing | None = None
    gpu: str = ""
    tolerance: tuple[float, float] | None = None  # (atol, rtol) of its check


def export_run(run: Any, out_dir: str | Path, *, runs_dir: str | Path = "runs", name: str | None = None,
               arch: str | None = None) -> ExportResult:
    """Export the best kernel of ``run`` (a loaded Run, a run folder or a run id). The cubin is
    compiled for the arch of the GPU the run was measured on, unless ``arch`` is given. The
    problem comes from the run's record (never from importing its problem file)."""
    return export_runs([run], out_dir, runs_dir=runs_dir, name=name, arch=arch)


def export_runs(runs: list[Any], out_dir: str | Path, *, runs_dir: str | Path = "runs", name: str | None = None,
                arch: str | None = None) -> ExportResult:
    """One export of the best kernels of several runs of one problem at different shapes or dtypes
    (``kerngen generate P --shape A,B,C`` makes them): one shape bucket per distinct shape and dtype,
    the fastest kernel kept where two runs share one; the first run's bucket is the op's first. The
    op then picks, for a call's shapes, the bucket that was checked at exactly those shapes, else the
    nearest one whose constraints admit them (:mod:`kerngen.results.exported_op`)."""
    from kerngen.agent.tree import Run, load_run

    loaded = [r if isinstance(r, Run) else load_run(r, runs_dir) for r in runs]
    sources = [_source(r) for r in loaded]
    first_source = sources[0][0].source
    for run, (ref, _) in zip(loaded, sources):
        if ref.source != first_source or ref.precision != sources[0][0].precision:
            raise ExportError(f"run {run.id} is of {ref.label()}, not {sources[0][0].label()}: one export holds "
                              "the shape buckets of one problem at one precision")
    kept: dict[str, tuple[Any, BucketSource]] = {}
    for run, (ref, bucket) in zip(loaded, sources):
        key = json.dumps([[list(t.shape), t.dtype] for t in bucket.info.inputs + bucket.info.params])
        old = kept.get(key)
        if old is None or _ms(bucket) < _ms(old[1]):
            kept[key] = (run, bucket)
    first_run, first = next(iter(kept.values()))
    gpu = first_run.tree.gpu
    try:
        return export_spec(first.spec, first.config, first.info.ref, out_dir, name=name,
                           demo=first_run.started.demo, arch=arch or (gpu.arch if gpu else None),
                           origin=first.origin, timing=first.timing, gpu=first.gpu, info=first.info,
                           more=[b for _, b in list(kept.values())[1:]], tolerance=first.tolerance)
    except KerngenError as exc:
        raise type(exc)(f"run {first_run.id}: {exc}") from None


def _ms(bucket: BucketSource) -> float:
    return bucket.timing.median_ms if bucket.timing is not None else math.inf


def _source(run: Any) -> tuple[ProblemRef, BucketSource]:
    """A run's best kernel as a bucket, from the run's record (never from importing its problem file)."""
    from kerngen.agent.problem_data import recorded_info

    best = run.best
    spec = best.best_spec() if best is not None else None
    if best is None or spec is None:
        raise ExportError(f"run {run.id} has no correct kernel to export")
    result = best.best_result
    gpu = run.tree.gpu
    try:
        info = recorded_info(run.started)
    except KerngenError as exc:
        raise type(exc)(f"run {run.id} node #{best.id}: {exc}") from None
    origin = (f"{DEMO_LABEL}, a toy kernel: " if run.started.demo else "") + f"run {run.id} node #{best.id}"
    check = result.check if result is not None else None
    return info.ref, BucketSource(spec=spec, config=best.config, info=info, origin=origin,
                                  timing=result.timing if result is not None else None, gpu=gpu.name if gpu else "",
                                  tolerance=(check.atol, check.rtol) if check is not None and check.atol else None)
