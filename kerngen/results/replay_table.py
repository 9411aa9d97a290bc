"""The table of ``kerngen replay``: each node of the record, its recorded verdict and time beside
the ones measured now, and their ratio (:func:`kerngen.agent.replay.replay_run` gives the rows).
Every text a model wrote is printed as text (no markup, no control sequences)."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from kerngen.agent.replay import ReplayOutcome
from kerngen.redact import printable


def replay_table(rep: ReplayOutcome) -> Table:
    o_gpu = rep.original.tree.gpu.name if rep.original.tree.gpu else "?"
    n_gpu = rep.outcome.tree.gpu.name if rep.outcome.tree.gpu else "?"
    t = Table(title=Text(printable(f"replay of {rep.original.id}: recorded on {o_gpu} vs now on {n_gpu}")))
    for col, just in (("node", "right"), ("kind", "left"), ("idea", "left"), ("recorded", "left"),
                      ("rec ms", "right"), ("now", "left"), ("now ms", "right"), ("rec/now", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rep.rows:
        idea = printable(" ".join(r.idea.split()))  # a model's text: no markup, no control sequences
        t.add_row(str(r.node), r.kind, Text((idea[:48] + "...") if len(idea) > 51 else idea), r.recorded_verdict,
                  _ms(r.recorded_ms), r.new_verdict, _ms(r.new_ms), f"{r.ratio:.2f}" if r.ratio else "")
    return t


def _ms(v: float) -> str:
    return f"{v:.4f}" if math.isfinite(v) else "-"
