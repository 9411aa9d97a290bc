"""``kerngen problems``: list the built-ins, or describe problems (built-in names or files).

Works without a GPU and fast at multi-GB sizes: everything is computed on meta tensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from kerngen.cli.guard import error_line
from kerngen.text import one_line


def problems(
    paths: Optional[List[str]] = typer.Argument(
        None, metavar="[PATH|NAME]...",
        help="KernelBench-format files, folders of them, or built-in names; none lists the built-ins"
    ),
    shape: Optional[str] = typer.Option(
        None, "--shape", help="built-ins only: shape override, e.g. 8192x1024 (its meaning is per problem)"
    ),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", help="built-ins only: bf16, fp16, fp32 (or bfloat16, float16, float32)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print a JSON list of problem descriptions"),
    to_dtype: Optional[str] = typer.Option(
        None, "--to-dtype", help="KernelBench files: write a copy of each that runs in this dtype (bf16, fp16, fp32) "
        "into --out, then describe the copies"
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="the folder --to-dtype writes its copies into"),
) -> None:
    """List the built-in problems, or describe problems: tensors, sizes, FLOPs, bytes, tolerance; with --to-dtype,
    first write a copy of each KernelBench file that runs in another dtype (--dtype reaches built-ins only)."""
    from rich.console import Console

    from kerngen.problems import describe, registry
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef, canonical_dtype, parse_shape
    from kerngen.errors import ProblemError
    from kerngen.results.suite import expand_problems

    shape_t = parse_shape(shape) if shape is not None else None
    dtype_s = canonical_dtype(dtype) if dtype is not None else None
    # a folder: its .py files (a missing file stays one line below, beside the good ones)
    sources = [s for p in paths or [] for s in (expand_problems([p]) if Path(p).is_dir() else [p])]
    if to_dtype is not None or out is not None:
        sources = _copies(sources, to_dtype, out)
    if not sources and (shape_t is not None or dtype_s is not None):
        raise ProblemError("--shape/--dtype need a built-in name, e.g. kerngen problems softmax --shape 8192x1024")
    if not sources and not as_json:
        describe.print_builtins(Console())
        return
    if not sources:
        sources = registry.builtin_names()
    infos, bad = [], 0
    for source in sources:  # a bad file is one line on stderr; the good ones are still described
        try:
            infos.append(load_problem(ProblemRef(source=source, shape=shape_t, dtype=dtype_s)).info)
        except Exception as exc:  # noqa: BLE001 - any failure of one file, as one line
            if len(sources) == 1:
                raise
            bad += 1
            error_line(one_line(str(exc) if isinstance(exc, ProblemError) else f"{source}: {type(exc).__name__}: {exc}"))
    if as_json:
        typer.echo(json.dumps([i.model_dump(mode="json") for i in infos], indent=2))
    elif infos:
        describe.print_problems(Console(), infos)
    if bad:
        raise ProblemError(f"{bad} of {len(sources)} problems could not be described (see above)")



def _copies(sources: list[str], to_dtype: str | None, out: Path | None) -> list[str]:
    """Write the dtype copies of ``sources`` (KernelBench files) into ``out``; their paths."""
    from kerngen.errors import ProblemError
    from kerngen.problems.dtype_copy import dtype_copy, dtype_copy_name
    from kerngen.problems.registry import is_builtin

    if to_dtype is None or out is None or not sources:
        raise ProblemError("--to-dtype and --out go together, with one or more KernelBench files")
    texts = []
    for source in sources:
        if is_builtin(source):
            raise ProblemError(f"{source} is a built-in: it takes --dtype itself")
        texts.append((dtype_copy_name(Path(source), to_dtype), dtype_copy(Path(source), to_dtype)))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts:
        (out / name).write_text(text)
        written.append(str(out / name))
    typer.echo(f"wrote {len(written)} cop{'y' if len(written) == 1 else 'ies'} in {to_dtype} to {out}", err=True)
    return written
