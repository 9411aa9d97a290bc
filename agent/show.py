"""``kerngen show RUN``: the tree of a run (ideas, categories, verdicts, ms, speedups, registers),
rendered with rich. Needs no GPU: everything comes from the journal, and nothing is imported
(a run's problem file never is).

A journal may come from anyone and its texts from a model: every text taken from it goes
through :func:`_say` (terminal control sequences removed, rich markup escaped)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree as RichTree

from kerngen.agent.tree import Node, Run, Tree
from kerngen.harness.redact import printable

_COLOR = {"ok": "green", "incorrect": "red", "invalid_spec": "magenta", "compile_error": "magenta",
          "runtime_error": "red", "timeout": "yellow", "invalid": "bright_black", "pending": "cyan"}


def _say(text: object) -> str:
    """Text from a journal as rich markup that prints it as is: no control sequence, no markup."""
    return escape(printable(str(text)))


def node_label(tree: Tree, n: Node, best_id: int | None = None) -> str:
    v = n.verdict
    parts = [f"[bold]#{n.id}[/]"]
    if n.kind == "repair":
        parts.append(f"repair {n.attempt}")
    elif n.kind == "seed":
        parts.append("seed")
    elif n.branch_index is not None:
        parts.append(f"branch {n.branch_index}")
    parts.append(f"[{_COLOR.get(v, 'white')}]{v}[/]")
    if n.ok:
        f = tree.figures(n)
        parts.append(f"{n.ms:.4f} ms")
        if f["speedup_eager"]:
            parts.append(f"{f['speedup_eager']:.2f}x eager")
        if f["speedup_compile"]:
            parts.append(f"{f['speedup_compile']:.2f}x compile")
        if f["pct_roofline"]:
            parts.append(f"{f['pct_roofline']:.0f}% roofline")
        r = n.best_result
        if r is not None and r.compile is not None and r.compile.kernels:
            w = r.compile.worst()
            parts.append(f"{w.registers} regs" + (f", {w.spill_stores}B spills" if w.spill_stores else ""))
        if n.tuned_ok:
            cfg = _say(",".join(f"{k}={v}" for k, v in n.config.items()))
            base = n.result.ms if n.result else math.inf
            parts.append(f"tuned [{cfg}]" + (f" from {base:.4f}" if math.isfinite(base) and base != n.ms else ""))
    elif n.spec is None:
        parts.append(_say(_short(n.error, 90)))
    elif n.result is not None:
        parts.append(_say(_short(n.result.message or n.result.log, 90)))
    if best_id is not None and n.id == best_id:
        parts.append("[bold yellow]<- best[/]")
    return " ".join(parts)


def _short(text: str, width: int) -> str:
    line = " ".join(printable(text or "").split())
    return line if len(line) <= width else line[: width - 3] + "..."


def _add_chain(tree: Tree, branch: Any, n: Node, best_id: int | None, seen: set[int] | None = None) -> None:
    seen = set() if seen is None else seen
    if n.id in seen:  # a journal that makes a node its own ancestor: show it once
        return
    seen.add(n.id)
    sub = branch.add(node_label(tree, n, best_id))
    for cid in n.children:
        c = tree.nodes.get(cid)
        if c is not None and c.kind == "repair":
            _add_chain(tree, sub, c, best_id, seen)


def render_tree(run: Run) -> RichTree:
    tree = run.tree
    best = tree.best()
    best_id = best.id if best else None
    title = f"[bold]{_say(run.id)}[/] {_say(tree.problem.label() if tree.problem else '')}"
    root = RichTree(title)
    seeds = [n for n in tree.nodes.values() if n.kind == "seed"]
    if seeds:
        s = root.add("seed kernel")
        for n in seeds:
            _add_chain(tree, s, n, best_id)
    rounds = sorted(set(tree.beams) | {n.round for n in tree.nodes.values() if n.kind == "branch"})
    for r in rounds:
        beam = tree.beams.get(r, [])
        rf = tree.rounds_finished.get(r)
        extra = ""
        if rf is not None and rf.best is not None and rf.best_ms:
            extra = f" -> best #{rf.best} {rf.best_ms:.4f} ms" + (" (improved)" if rf.improved else "")
        rb = root.add(f"[bold]round {r}[/] beam: {', '.join('#' + str(b) if b is not None else 'nothing' for b in beam)}"
                      + extra)
        parents = [p for p in beam] or sorted({n.parent for n in tree.nodes.values()
                                                if n.round == r and n.kind == "branch"}, key=lambda x: (x is None, x))
        for pid in parents:
            pb = rb.add(f"from {'#' + str(pid) if pid is not None else 'nothing'}")
            ideas = tree.ideas.get((r, pid), [])
            for i, idea in enumerate(ideas):
                ib = pb.add(f"[cyan]idea {i}[/] [dim]\\[{idea.category.value}][/] {_say(_short(idea.text, 110))}")
                heads = sorted((n for n in tree.nodes.values() if n.kind == "branch" and n.round == r
                                and n.parent == pid and n.idea_index == i), key=lambda n: n.id)
                if not heads:
                    ib.add("[dim](not implemented)[/]")
                for n in heads:
                    _add_chain(tree, ib, n, best_id)
    return root


def render_header(run: Run) -> Table:
    tree = run.tree
    st = run.started
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("run", _say(f"{run.id} ({run.path})"))
    t.add_row("problem", _say(tree.problem.label() if tree.problem else "?"))
    info = st.problem_info.info if st.problem_info is not None else None
    if info is not None and info.description:
        t.add_row("", _say(_short(info.description, 110)))
    t.add_row("GPU", _say(tree.gpu.name if tree.gpu else "?"))
    t.add_row("proposer", _say(st.proposer + (f" ({st.model})" if st.model else "")))
    if st.replay_of:
        t.add_row("replay of", _say(st.replay_of))
    c = st.config
    t.add_row("search", f"beam {c.beam}, ideas {c.ideas}, branches {c.branches}, repairs {c.repairs}, "
                        f"tune {'on' if c.tune else 'off'}")
    b = tree.baseline
    if b is not None:
        comp = f"{b.compiled.median_ms:.4f} ms" if b.compiled else _say(_short(f"n/a {b.compile_error}", 110))
        floor = f"{b.floor_ms:.4f} ms ({_say(b.floor_bound)})" if b.floor_ms else "n/a"
        t.add_row("baseline", f"eager {b.eager.median_ms:.4f} ms, torch.compile {comp}, floor {floor}")
    best = tree.best()
    if best is not None:
        f = tree.figures(best)
        bits = [f"#{best.id} {best.ms:.4f} ms"]
        if f["speedup_eager"]:
            bits.append(f"{f['speedup_eager']:.2f}x eager")
        if f["speedup_compile"]:
            bits.append(f"{f['speedup_compile']:.2f}x torch.compile")
        if f["pct_roofline"]:
            bits.append(f"{f['pct_roofline']:.0f}% of roofline")
        t.add_row("best", ", ".join(bits))
    else:
        t.add_row("best", "no correct kernel yet")
    verdicts: dict[str, int] = {}
    for n in tree.nodes.values():
        verdicts[n.verdict] = verdicts.get(n.verdict, 0) + 1
    t.add_row("nodes", f"{len(tree.nodes)}: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))
    status = (f"finished: {_say(_short(tree.finished.reason, 200))}" if tree.finished
              else "unfinished (continue with --resume)")
    if run.truncated:
        status += f"; a partial last event ({run.truncated} bytes) is ignored"
    t.add_row("status", f"{status}; {run.sessions} session(s)")
    if tree.finished and tree.finished.usage:
        u = tree.finished.usage
        cost = f", ${u['cost_usd']:.2f}" if u.get("cost_usd") is not None else ""
        t.add_row("spent", f"{_count(u.get('llm_calls'))} LLM calls, {_count(u.get('tokens'))} tokens{cost}, "
                           f"{u.get('gpu_s', 0) / 60:.1f} GPU min, {u.get('wall_s', 0) / 60:.1f} wall min")
    return t


def _count(value: object) -> str:
    """A recorded count as an integer ("?" for what a journal should not hold: inf, NaN, text)."""
    return str(int(value)) if isinstance(value, (int, float)) and math.isfinite(value) else "0" if value is None else "?"


def render(run: Run) -> Group:
    return Group(render_header(run), render_tree(run))
