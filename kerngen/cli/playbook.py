"""``kerngen playbook``: what the offline playbook knows about a problem (its family, variants and
ideas), and a variant's kernel spec written out for ``kerngen bench`` / ``kerngen tune``. No GPU.

Only variants that admit at least one configuration at the problem's shape are offered (the same
resolution as ``kerngen check``: :func:`kerngen.harness.tune.admissible.admissible`, for the limits
of ``--arch``, sm_90 by default); the others are listed with why. ``-o`` writes the first offered
variant (or ``--variant``'s, an error when that one admits nothing), its default configuration
admissible; a problem none of whose variants admits anything is an error with the reason.
``--precision tf32`` (as generate's): the tensor-core variants offer plain TF32 (TERMS 1, their default there).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer

from kerngen.errors import KerngenError


def _cfg_text(cfg: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg.items()) or "(no tunables)"


def _moved_text(vo: Any) -> str:
    """When the builder's default configuration is pruned here: which one the spec uses instead."""
    if vo.moved_from is None:
        return ""
    now = vo.spec.default_config()
    was = {k: v for k, v in vo.moved_from.items() if now.get(k) != v}
    new = {k: now[k] for k in was}
    return f"; its default {_cfg_text(was)} is not admissible here, the spec's default is {_cfg_text(new)}"


def playbook(
    problem: str = typer.Argument(..., help="built-in problem name, KernelBench-format .py file, or a folder of them"),
    shape: Optional[str] = typer.Option(None, "--shape", help="built-ins: shape, e.g. 8192x1024"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="built-ins: fp32 | fp16 | bf16"),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32 (true fp32, the default) | tf32 "
                                            "(PyTorch's TF32 reference: plain TF32 kernels offered)"),
    variant: Optional[str] = typer.Option(None, "--variant", help="the template variant to write out"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the variant's kernel spec (JSON) here"),
    arch: Optional[str] = typer.Option(None, "--arch", help="count configurations for this target's limits "
                                       "(default sm_90)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of text"),
    no_cache: bool = typer.Option(False, "--no-cache", help="a folder: work every file out again (each file's "
                                  "answer is cached by its content and kerngen's source)"),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="a folder: files worked out at once, one process "
                             "each (0: one per CPU core)"),
) -> None:
    """Show the playbook's family, variants (with their admissible configurations at the problem's
    shape, or why none) and ideas for PROBLEM; with --out, write a variant's kernel spec (all its
    tunables, an admissible default) for kerngen bench / kerngen tune. For a folder: one line per
    file (its family and offered variants, or why none) and the count covered."""
    from rich.console import Console
    from rich.markup import escape

    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import parse_problem_ref

    from kerngen.agent.playbook import family_of
    from kerngen.agent.playbook.coverage import DEFAULT_ARCH
    from kerngen.agent.playbook.proposer import PlaybookProposer
    from kerngen.agent.playbook.terms import terms_line
    from kerngen.cli.check import ARCH_RE
    from kerngen.harness.tune.admissible import limits_for

    arch = (arch or DEFAULT_ARCH).strip()
    if not ARCH_RE.match(arch):
        raise KerngenError(f"bad --arch {arch!r}: expected sm_XY, e.g. sm_90")
    if Path(problem).is_dir():
        if variant is not None or out is not None or shape is not None or dtype is not None or precision is not None:
            raise KerngenError("--variant, --out, --shape, --dtype and --precision are for one problem, not a folder")
        _folder(Path(problem), limits_for(arch), as_json, cached=not no_cache, jobs=jobs or os.cpu_count() or 1)
        return
    ref = parse_problem_ref(problem, shape=shape, dtype=dtype, precision=precision)
    prob = load_problem(ref)
    prop = PlaybookProposer(prob, gpu=limits_for(arch))
    if (prop.match is None or not prop.offer or not prop.offer.offered) and out is None and variant is None:
        _model(ref.label(), prob, prop.reason, as_json)  # not one spec: a model plan, a kernel per region
        return
    if prop.recognised is None:
        raise KerngenError(f"the playbook has nothing for {ref.label()}: {prop.reason}")
    family = prop.recognised.family
    fam = family_of(prop.recognised)
    variants = fam.variants
    if variant is not None and variant not in variants:
        raise KerngenError(f"unknown --variant {variant!r} for family {family} (choose from {', '.join(variants)})")
    off = prop.offer
    if prop.match is None or off is None:
        raise KerngenError(f"the playbook has nothing for {ref.label()}: {prop.reason}")
    offered = [v.variant for v in off.offered]
    console = Console(highlight=False, soft_wrap=True)
    if out is None and as_json:
        ideas = [{"id": e.id, "category": e.category.value, "variant": e.variant, "text": prop.text_of(e),
                  "offered": e.variant in offered} for e in fam.ideas]
        typer.echo(json.dumps({"problem": ref.label(), "family": family, "limits": off.limits, "shape": off.where,
                               "variants": offered, "not_offered": {v.variant: v.why for v in off.dropped},
                               "configurations": {v.variant: v.summary() for v in off.variants},
                               "ideas": ideas}, indent=2))
        return
    if out is None:
        dropped = f"; not offered: {', '.join(v.variant for v in off.dropped)}" if off.dropped else ""
        console.print(f"[bold]{escape(ref.label())}[/]: family {family}; variants: {', '.join(offered)}{dropped}")
        if family == "regions":  # what each region is and which family serves it
            console.print(f"  {prop.recognised.message}", markup=False)
        for v in off.offered:
            sample = f" (a sample of {v.counted.enumerated})" if v.counted.sampled else ""
            console.print(f"  {v.variant}: {v.count} of {v.total} configurations{sample} admissible at {off.where} "
                          f"({off.limits}){_moved_text(v)}{terms_line(v.spec)}", markup=False)
        for v in off.dropped:
            console.print(f"  {v.variant} not offered: {v.why}", markup=False)
        for entry in fam.ideas:
            if entry.variant in offered:
                console.print(f"  {entry.id} [{entry.category.value}] ({entry.variant}): "
                              f"{prop.text_of(entry)}", markup=False)
        return
    name = variant or offered[0]
    vo = off.get(name)
    if vo is None or vo.spec is None:
        raise KerngenError(f"not written: {off.why_not(name)}")
    spec = vo.spec
    try:
        spec.dump(out)
    except OSError as exc:
        raise KerngenError(f"cannot write {out}: {exc.strerror or exc}") from None
    if as_json:
        typer.echo(json.dumps({"problem": ref.label(), "family": family, "variant": name, "wrote": str(out),
                               "spec": spec.name, "configurations": spec.space_size(), "admissible": vo.count,
                               "limits": off.limits, "default": spec.default_config(),
                               "builder_default": vo.moved_from,
                               "tunables": {k: list(v) for k, v in spec.tunables.items()}}, indent=2))
        return
    console.print(f"wrote {out}: {spec.name}, {spec.space_size()} configurations "
                  f"({', '.join(f'{k} {len(v)}' for k, v in spec.tunables.items())}), {vo.count} admissible at "
                  f"{off.where} ({off.limits}){_moved_text(vo)}", markup=False)


def _model(label: str, problem: Any, reason: str, as_json: bool) -> None:
    """A problem no one spec covers, as a model plan (:mod:`kerngen.agent.playbook.model_plan`): its regions,
    the family and variant of each that a kernel computes, what runs as PyTorch and why. An error (exit 1) when no
    region gets a kernel."""
    from rich.console import Console
    from rich.markup import escape

    from kerngen.agent.playbook import NotCovered
    from kerngen.agent.playbook.model_plan import plan_model

    try:
        mp = plan_model(problem)
    except NotCovered as exc:
        raise KerngenError(f"the playbook has nothing for {label}: {exc}") from None
    if not mp.kernels:
        raise KerngenError(f"the playbook has nothing for {label}: no region gets a kernel ({reason})")
    if as_json:
        typer.echo(json.dumps({"problem": label, "family": "model", "whole": reason, "regions": [
            {"region": r.region.index, "nodes": list(r.region.nodes), "family": r.family or None,
             "variant": r.variant or None, "offered": list(r.offered), "fallback": r.why or None}
            for r in mp.regions], "views": list(mp.views)}, indent=2))
        return
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"[bold]{escape(label)}[/]: a model plan of {len(mp.regions)} regions, {len(mp.kernels)} as kerngen "
                  f"kernels, {len(mp.fallbacks)} as PyTorch (not one spec: {reason[:200]})")
    for line in mp.lines():
        console.print(f"  {line}", markup=False)
    console.print("  kerngen generate runs a search per kernel region and checks and times the assembled model",
                  markup=False)


def _folder(folder: Path, gpu: Any, as_json: bool, cached: bool = True, jobs: int = 1) -> None:
    """The coverage of every problem file of ``folder`` (or of its sub-folders), a progress bar on
    stderr as it goes; each file's row cached (:class:`_RowCache`) unless ``cached`` is False. The
    files not in the cache are worked out by ``jobs`` processes at once (each file's offer is pure
    CPU work in Python: configuration pruning), printed in the folder's order."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from kerngen.agent.playbook.coverage_table import coverage_row, problem_files

    files = problem_files(folder)
    if not files:
        raise KerngenError(f"no .py problem files in {folder} or its sub-folders")
    console = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True)
    cache = _RowCache(gpu.name) if cached else None
    rows: list[Any] = [cache.get(f, folder) if cache is not None else None for f in files]
    todo = [i for i, r in enumerate(rows) if r is None]
    shown = 0

    def show_ready() -> None:  # rows in the folder's order, each as soon as every row before it is known
        nonlocal shown
        while shown < len(rows) and rows[shown] is not None:
            r = rows[shown]
            if not as_json:
                what = f"{r.family} [{', '.join(r.variants)}]" if r.variants else f"{r.family}: {r.why}"
                console.print(f"{r.file}  {what}", markup=False)
            shown += 1

    def done(i: int, r: Any) -> None:
        rows[i] = r
        if cache is not None:
            cache.put(files[i], folder, r)
        bar.update(task, description=f"{files[i].name[:40]:<40}", advance=1)
        show_ready()

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), console=err, transient=True,
                  disable=not err.is_terminal) as bar:
        task = bar.add_task("playbook", total=len(files), completed=len(files) - len(todo))
        show_ready()
        workers = min(jobs, len(todo) // 3)  # a process costs an import of torch: worth it from 3 files each
        if workers <= 1:
            for i in todo:
                done(i, coverage_row(files[i], folder, gpu))
        else:
            # spawned, not forked: the parent has torch loaded, and a fork of its thread pools can hang
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                futures = {i: pool.submit(coverage_row, files[i], folder, gpu) for i in todo}
                for i in todo:
                    done(i, futures[i].result())
    covered = sum(1 for r in rows if r.variants)
    if as_json:
        typer.echo(json.dumps({"folder": str(folder), "limits": gpu.name, "files": len(rows), "covered": covered,
                               "rows": [r.to_json() for r in rows]}, indent=1))
        return
    families = sorted({r.family for r in rows if r.variants})
    hits = f"; {cache.hits} of {len(rows)} from the cache (--no-cache works them out again)" if cache and cache.hits else ""
    console.print(f"{covered} of {len(rows)} files have a playbook kernel ({gpu.name}); families: "
                  f"{', '.join(families) or 'none'}{hits}", markup=False)


class _RowCache:
    """A folder's coverage rows on disk (``$KERNGEN_CACHE_DIR/playbook/``), one file per problem
    file, keyed by the file's bytes and path, the GPU limits and kerngen's source
    (:func:`kerngen.version.source_hash`): a change to any of them works the row out again. An
    unreadable entry is worked out again too."""

    def __init__(self, limits: str) -> None:
        from kerngen.harness.cache_dir import cache_root
        from kerngen.version import source_hash

        self.dir = cache_root() / "playbook"
        self.salt = f"{source_hash()}\0{limits}\0".encode()
        self.hits = 0

    def _path(self, f: Path) -> Path | None:
        import hashlib

        try:
            data = f.read_bytes()
        except OSError:
            return None  # coverage_row says why
        key = hashlib.sha256(self.salt + str(f.resolve()).encode() + b"\0" + data).hexdigest()[:32]
        return self.dir / f"{key}.json"

    def get(self, f: Path, folder: Path) -> Any:
        from kerngen.agent.playbook.coverage_table import CoverageRow

        path = self._path(f)
        try:
            data = json.loads(path.read_text()) if path is not None else None
            row = CoverageRow(file=f.relative_to(folder).as_posix(), family=str(data["family"]),
                              variants=tuple(str(v) for v in data["variants"]), why=str(data["why"]))
        except (OSError, ValueError, TypeError, KeyError):
            return None
        self.hits += 1
        return row

    def put(self, f: Path, folder: Path, row: Any) -> None:
        from kerngen.harness.atomic import write_atomic

        path = self._path(f)
        if path is None:
            return
        try:
            write_atomic(path, json.dumps({k: v for k, v in row.to_json().items() if k != "file"}))
        except OSError:
            pass  # a cache that cannot be written costs time, never the answer
