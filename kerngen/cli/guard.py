"""The one error guard of the CLI: a :class:`~kerngen.errors.KerngenError` becomes one line on
stderr and its exit code; for commands that read folders someone handed over (runs, exports), any
other error too. Every command module wraps its commands with :func:`guard`."""

from __future__ import annotations

import functools
from typing import Any, Callable

import typer
from rich.console import Console
from rich.markup import escape

from kerngen.errors import KerngenError
from kerngen.redact import redact
from kerngen.text import one_line


def error_line(text: str) -> None:
    """One error line on stderr, secrets (an API key, a password in a URL) redacted."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(redact(text))}",
                                                                markup=True)


def warn_torn(run: Any) -> None:
    """A run whose last journal line is unreadable (a write cut short) is read without it: say so
    on stderr (show, report and export go on; a resume cuts the line off)."""
    if getattr(run, "truncated", 0):
        Console(stderr=True, highlight=False, soft_wrap=True).print(one_line(
            f"warning: run {run.id}: the last line of its journal ({run.truncated} bytes) is unreadable, a write cut "
            "short: it is skipped (kerngen generate --resume cuts it off)"), markup=False)


def guard(fn: Callable[..., Any], *, data: bool = False) -> Callable[..., Any]:
    """KerngenError -> one line on stderr, exit 2. ``data``: a command that reads run or export
    folders (which may come from anyone): any other error is one line too, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KerngenError as exc:
            error_line(one_line(str(exc)))
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - bad data must not end in a traceback
            if not data:
                raise
            error_line(one_line(f"{fn.__name__} failed on bad input: {type(exc).__name__}: {exc}"))
            raise typer.Exit(2) from None

    return wrapper
