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
) -> None:
    """List the built-in problems, or describe problems: tensors, sizes, FLOPs, bytes, tolerance."""
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

