"""``kerngen spec``: what a kernel spec is, from the spec's own model (no GPU, no torch): its
fields in a few lines, or with ``--schema`` the JSON schema the LLM is given (docs/spec.md
explains every field with an example)."""

from __future__ import annotations

import typer


def spec_cmd(
    schema: bool = typer.Option(False, "--schema", help="print the JSON schema of a kernel spec (JSON Schema "
                                "2020-12, as pydantic writes it)"),
) -> None:
    """The kernel spec's fields, or its JSON schema (--schema)."""
    from rich.console import Console

    from kerngen.harness.spec.spec import KernelSpec

    if schema:
        typer.echo(KernelSpec.schema_json())
        return
    out = Console(highlight=False, soft_wrap=True)
    props = KernelSpec.model_json_schema()["properties"]
    out.print("A kernel spec is a JSON (or YAML) object; its fields:", markup=False)
    for name, field in props.items():
        what = field.get("description") or field.get("title", "")
        out.print(f"  {name}: {what}", markup=False)
    out.print("kerngen spec --schema prints the JSON schema; docs/spec.md explains each field with an example; "
              "kerngen check SPEC PROBLEM vets one.", markup=False)
