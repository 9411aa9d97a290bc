"""The one error guard of the CLI: a :class:`~kerngen.errors.KerngenError` becomes one line on
stderr and its exit code; for commands that read folders someone handed over (runs, exports), any
other error too. Every command module wraps its commands with :func:`guard`. Beside it, what every
command's output needs: one clean line (:func:`one_line`), strict JSON (:func:`strict_json`)."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import typer
from rich.console import Console
from rich.markup import escape

from kerngen.errors import KerngenError
from kerngen.redact import printable


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line, without control sequences (messages quote journal and model text)."""
    line = " ".join(printable(str(text)).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def strict_json(value: Any) -> Any:
    """A copy of a JSON-like value with inf/NaN as None (keys as strings), so that ``--json``
    prints strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def error_line(text: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(text)}", markup=True)


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
