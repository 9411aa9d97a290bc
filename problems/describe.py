"""Rich rendering of problems for the CLI (``kerngen problems``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from kerngen.problems import registry

if TYPE_CHECKING:
    from kerngen.problems.info import ProblemInfo


def _dims(shape: Iterable[int]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def human(x: float | int | None, unit: str) -> str:
    if x is None:
        return "-"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:g} {unit}"


def builtins_table() -> Table:
    """The built-in suite: name, default shape and dtype, what ``--shape`` means."""
    table = Table(title="built-in problems", title_justify="left", show_lines=False)
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("default shape", no_wrap=True)
    table.add_column("dtype", no_wrap=True)
    table.add_column("--shape means")
    for name in registry.builtin_names():
        f = registry.builtin_facts(name)
        table.add_row(name, _dims(f["shape"] or ()), f["dtype"], f["shape_doc"])
    return table


def problem_table(info: "ProblemInfo") -> Group:
    """One problem: its tensors (inputs, parameters, outputs), then sizes, FLOPs, bytes, tolerance."""
    title = info.name if info.ref.label() == info.name else f"{info.name}  ({info.ref.label()})"
    table = Table(title=title, title_justify="left", title_style="bold cyan")
    table.add_column("role", style="dim", no_wrap=True)
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("shape", no_wrap=True)
    table.add_column("dtype", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    for role, items in (("input", info.inputs), ("param", info.params), ("output", info.outputs)):
        for t in items:
            table.add_row(role, t.name, _dims(t.shape), t.dtype, human(t.nbytes, "B"))
    for name, value in info.scalars.items():
        table.add_row("scalar", name, "-", type(value).__name__, "-")

    facts = Text()
    if info.description:
        facts.append(info.description + "\n", style="italic")
    facts.append(f"file: {info.path}\n", style="dim")
    if info.shape_doc:
        facts.append(f"shape: {_dims(info.shape or ())} = {info.shape_doc}\n")
    sizes = ", ".join(f"{k}={v}" for k, v in info.sizes.items()) or "(none)"
    facts.append(f"sizes: {sizes}\n")
    flops = human(info.flops, "FLOP") if info.flops else "n/a (memory-bound)"
    if info.flops and info.flops_source == "meta":
        flops += " (from KERNGEN_META)"
    facts.append(f"FLOPs: {flops}    minimum bytes: {human(info.min_bytes, 'B')} ({info.min_bytes:,})\n")
    facts.append(f"dtype: {info.dtype}    tolerance: atol={info.atol:g} rtol={info.rtol:g}")
    return Group(table, facts, Text(""))


def print_builtins(console: Console) -> None:
    console.print(builtins_table())
    console.print(
        "[dim]describe one: kerngen problems NAME [--shape 8192x1024] [--dtype bf16]; "
        "any KernelBench-format file: kerngen problems path/to/file.py[/]"
    )


def print_problems(console: Console, infos: list["ProblemInfo"]) -> None:
    for info in infos:
        console.print(problem_table(info))
