"""The ``kerngen`` command. Each subcommand lives beside the code it drives and registers
itself here; heavy imports (torch, cupy) happen inside the commands, so ``--help`` is fast."""

from __future__ import annotations

import importlib
import logging
import os
import sys

import typer
from rich.console import Console

from kerngen.errors import KerngenError

app = typer.Typer(
    name="kerngen",
    help="Generate, check and benchmark fast CUDA-C kernels for PyTorch ops.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# module -> it defines register(app)
COMMAND_MODULES = (
    "kerngen.problems.cli",  # problems
    "kerngen.harness.cli",  # bench
    "kerngen.harness.check_cli",  # check
    "kerngen.harness.tune_cli",  # tune
    "kerngen.agent.cli",  # generate, show, replay
    "kerngen.agent.results_cli",  # suite, report, export
    "kerngen.agent.playbook.cli",  # playbook
)

_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        for name in COMMAND_MODULES:
            importlib.import_module(name).register(app)
        _registered = True


def _configure_logging() -> None:
    """kerngen's own log lines (retries, torch.compile failures...) stay quiet unless asked for
    with KERNGEN_LOG_LEVEL=INFO|WARNING: the terminal shows results and one-line errors."""
    level = os.environ.get("KERNGEN_LOG_LEVEL", "ERROR").upper()
    logger = logging.getLogger("kerngen")
    logger.setLevel(getattr(logging, level, logging.ERROR))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


def main() -> None:
    _configure_logging()
    _register()
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        app()
    except KerngenError as exc:
        from rich.markup import escape

        err.print(f"[bold red]error:[/] {escape(_one_line(str(exc)))}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]")
        sys.exit(130)


def _one_line(text: str) -> str:
    """One line without terminal control sequences (an error may quote a model's text)."""
    from kerngen.harness.redact import printable

    line = " ".join(printable(str(text)).split())
    return line if len(line) <= 400 else line[:397] + "..."
