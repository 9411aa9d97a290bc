"""The live view of ``kerngen generate``: round, nodes evaluated, best speedup, LLM tokens.

A journal listener: it sees every event as it is written. Disabled (a no-op) when stderr is not
a terminal, so logs and pipes get plain text. Every cell is plain text (never rich markup) and
goes through :func:`kerngen.redact.printable`: what a model wrote (a tunable's name, a
verdict's message) cannot move the cursor, clear the screen or write the clipboard."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kerngen.agent.tree import Tree
from kerngen.redact import printable


def _cell(text: Any) -> Text:
    """One line of plain text for a table cell: no markup, no control sequences."""
    line = " ".join(printable(str(text)).split())
    return Text(line if len(line) <= 200 else line[:197] + "...")


class LiveView:
    def __init__(self, console: Console | None = None, enabled: bool | None = None, total_rounds: int | None = None):
        self.console = console or Console(stderr=True)
        self.enabled = self.console.is_terminal if enabled is None else enabled
        self.total_rounds = total_rounds
        self.tree = Tree()
        self.round = 0
        self.evaluated = 0
        self.created = 0
        self.tokens = 0
        self.calls = 0
        self.last = ""
        self._live: Live | None = None

    def __enter__(self) -> "LiveView":
        if self.enabled:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(*exc)
            self._live = None

    def __call__(self, ev: Any) -> None:
        self.tree.apply(ev)
        t = getattr(ev, "type", "")
        if t == "round_started":
            self.round = ev.round
        elif t == "node_created":
            self.created += 1
        elif t == "node_evaluated":
            self.evaluated += 1
            self.last = f"#{ev.id} {ev.result.verdict.value}" + (
                f" {ev.result.ms:.4f} ms" if ev.result.ok else f": {ev.result.message}")
        elif t == "llm_call":
            self.tokens, self.calls = ev.tokens, ev.calls
        elif t == "node_tuned" and ev.config:
            self.last = f"#{ev.id} tuned {ev.config}"
        if self._live is not None:
            self._live.update(self.render())

    def render(self) -> Table:
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold cyan")
        t.add_column()
        rounds = f"{self.round}" + (f" of {self.total_rounds}" if self.total_rounds else "")
        t.add_row("round", _cell(rounds))
        t.add_row("nodes", _cell(f"{self.evaluated} evaluated / {self.created} created"))
        best = self.tree.best()
        if best is not None and math.isfinite(best.ms):
            f = self.tree.figures(best)
            sp = f"{f['speedup_eager']:.2f}x eager" if f["speedup_eager"] else ""
            t.add_row("best", _cell(f"#{best.id} {best.ms:.4f} ms {sp}"))
        else:
            t.add_row("best", _cell("-"))
        t.add_row("LLM", _cell(f"{self.calls} calls, {self.tokens} tokens"))
        if self.last:
            t.add_row("last", _cell(self.last))
        return t
