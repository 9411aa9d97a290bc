"""``kerngen playbook``: what the offline playbook knows about a problem (its family, variants and
ideas), and a variant's kernel spec written out for ``kerngen bench`` / ``kerngen tune``. No GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kerngen.errors import KerngenError


def playbook(
    problem: str = typer.Argument(..., help="built-in problem name or KernelBench-format .py file"),
    shape: Optional[str] = typer.Option(None, "--shape", help="built-ins: shape, e.g. 8192x1024"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="built-ins: fp32 | fp16 | bf16"),
    variant: Optional[str] = typer.Option(None, "--variant", help="the template variant to write out"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the variant's kernel spec (JSON) here"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of text"),
) -> None:
    """Show the playbook's family, variants and ideas for PROBLEM; with --out, write a variant's
    kernel spec (all its tunables) for kerngen bench / kerngen tune."""
    from rich.console import Console

    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import parse_problem_ref

    from kerngen.agent.playbook import builders
    from kerngen.agent.playbook.catalog import CATALOG
    from kerngen.agent.playbook.families import explain
    from kerngen.agent.playbook.not_covered import NotCovered

    ref = parse_problem_ref(problem, shape=shape, dtype=dtype)
    try:
        match = explain(load_problem(ref))
    except NotCovered as exc:
        raise KerngenError(f"the playbook has nothing for {ref.label()}: {exc}") from None
    variants = builders.VARIANTS[match.family]
    if variant is not None and variant not in variants:
        raise KerngenError(f"unknown --variant {variant!r} for family {match.family} (choose from {', '.join(variants)})")
    console = Console(highlight=False, soft_wrap=True)
    if out is None and as_json:
        ideas = [{"id": e.id, "category": e.category.value, "variant": e.variant, "text": e.text}
                 for e in CATALOG[match.family]]
        typer.echo(json.dumps({"problem": ref.label(), "family": match.family, "variants": list(variants),
                               "ideas": ideas}, indent=2))
        return
    if out is None:
        console.print(f"[bold]{ref.label()}[/]: family {match.family}; variants: {', '.join(variants)}")
        for entry in CATALOG[match.family]:
            console.print(f"  {entry.id} [{entry.category.value}] ({entry.variant}): {entry.text}", markup=False)
        return
    name = variant or next(iter(variants))
    spec = builders.build(match, name)
    try:
        spec.dump(out)
    except OSError as exc:
        raise KerngenError(f"cannot write {out}: {exc.strerror or exc}") from None
    if as_json:
        typer.echo(json.dumps({"problem": ref.label(), "family": match.family, "variant": name, "wrote": str(out),
                               "spec": spec.name, "configurations": spec.space_size(),
                               "tunables": {k: list(v) for k, v in spec.tunables.items()}}, indent=2))
        return
    console.print(f"wrote {out}: {spec.name}, {spec.space_size()} configurations "
                  f"({', '.join(f'{k} {len(v)}' for k, v in spec.tunables.items())})", markup=False)
