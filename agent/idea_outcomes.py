"""What became of each idea, read off the tree: a branch's chain of repairs, the node a repair
should start from, and the one-line outcome of every idea of a round (what the journal's
``round_finished`` records and the next prompt shows as "tried")."""

from __future__ import annotations

import math

from kerngen.agent.proposer import UNREADABLE, TriedIdea
from kerngen.agent.tree import Node, Tree
from kerngen.harness.results import Verdict


def repair_chain(tree: Tree, head: int) -> list[Node]:
    """A branch node and its repairs, in order."""
    chain = [tree.nodes[head]]
    for n in sorted(tree.nodes.values(), key=lambda n: n.attempt):
        if n.repair_of == head and n.kind == "repair":
            chain.append(n)
    return chain

def repair_target(tree: Tree, head: int) -> Node | None:
    """What a repair of the chain starts from, when no node of it is correct: its latest node,
    if that one failed its evaluation or is an answer that could not be read (a model's answer
    goes back to it with the reason, as a failed kernel does). ``None``: nothing to repair (a
    node not evaluated yet, or one without a spec for another reason: no answer came)."""
    chain = repair_chain(tree, head)
    if any(n.ok for n in chain):
        return None
    last = chain[-1]
    if last.spec is None:
        return last if last.error.startswith(UNREADABLE) else None
    return last if last.failed else None



def tried(tree: Tree, r: int) -> list[TriedIdea]:
    """Round ``r``'s ideas with what became of them (what the next round's prompt shows)."""
    out = []
    for (rr, pid), ideas in sorted(tree.ideas.items(), key=lambda kv: (kv[0][0], kv[0][1] is None,
                                                                            kv[0][1] or 0)):
        if rr != r:
            continue
        parent = tree.nodes.get(pid) if pid is not None else None
        for i, idea in enumerate(ideas):
            nodes = [n for n in tree.nodes.values()
                     if n.round == r and n.parent == pid and n.idea_index == i and n.kind == "branch"]
            out.append(TriedIdea(idea=idea, outcome=outcome(tree, nodes, parent)))
    return out

def attempt_line(n: Node) -> str:
    """One line on one attempt of a branch (its first answer or a repair): what it was and why
    it was refused, as the repair of a later attempt shows the chain."""
    what = "first answer" if n.kind != "repair" else f"repair {n.attempt}"
    if n.spec is None:
        return f"{what}: {_short(n.error)}"
    if n.result is None:
        return f"{what}: not evaluated"
    return f"{what}: {n.result.verdict.value}: {_short(n.result.message or n.result.log)}"


def outcome(tree: Tree, heads: list[Node], parent: Node | None) -> str:
    """One line on what an idea's branches gave: the best speedup (and the time and registers of
    the slower branches), what compiled but was not run (a dry run), which failed and why."""
    if not heads:
        return "not implemented (no answer)"
    oks: list[Node] = []
    unmeasured: list[Node] = []
    failures: list[str] = []
    for h in heads:
        chain = repair_chain(tree, h.id)
        ok = [n for n in chain if n.ok]
        compiled = [n for n in chain if n.result is not None and n.result.verdict is Verdict.not_run]
        if ok:
            oks.append(min(ok, key=lambda n: n.ms))
        elif compiled:
            unmeasured.append(compiled[0])
        else:
            repairs, last = len(chain) - 1, chain[-1]
            v = last.verdict if last.spec is not None else "no valid spec"
            why = _short(last.error if last.spec is None else (last.result.message if last.result else ""), 90)
            after = f" after {repairs} repair{'s' if repairs != 1 else ''}" if repairs else ""
            failures.append(f"{v}{after}" + (f" ({why})" if why else ""))
    parts = []
    if oks:
        best = min(oks, key=lambda n: n.ms)
        if parent is not None and math.isfinite(parent.ms):
            parts.append(f"ok {parent.ms / best.ms:.2f}x vs parent ({best.ms:.4g} ms{_regs(best)})")
        else:
            sp = tree.figures(best)["speedup_eager"]
            parts.append(f"ok {best.ms:.4g} ms{_regs(best)}" + (f", {sp:.2f}x vs eager" if sp else ""))
        slower = [f"{n.ms:.4g} ms{_regs(n)}" for n in oks if n is not best]
        if slower:
            parts.append("slower branches: " + ", ".join(slower))
    if unmeasured:
        regs = ", ".join(_regs(n).lstrip(", ") or "?" for n in unmeasured)
        parts.append(f"{len(unmeasured)}/{len(heads)} compiled, not measured (dry run; {regs})")
    if failures:
        parts.append(f"{len(failures)}/{len(heads)} branches failed: " + "; ".join(failures))
    return "; ".join(parts)


def _regs(n: Node) -> str:
    r = n.best_result
    if r is None or r.compile is None or not r.compile.kernels:
        return ""
    return f", {r.compile.worst().registers} regs"


def _short(text: str | None, width: int = 160) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= width else line[: width - 3] + "..."
