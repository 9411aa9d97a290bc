"""What became of each idea, read off the tree: a branch's chain of repairs, the node a repair
should start from, and the one-line outcome of every idea of a round (what the journal's
``round_finished`` records and the next prompt shows as "tried")."""

from __future__ import annotations

import math

from kerngen.agent.proposer import UNREADABLE, TriedIdea
from kerngen.agent.tree import Node, Tree


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

def outcome(tree: Tree, heads: list[Node], parent: Node | None) -> str:
    """One line on what an idea's branches gave: the best speedup, and which failed and how."""
    if not heads:
        return "not implemented (no answer)"
    best: Node | None = None
    worst_verdicts: list[str] = []
    for h in heads:
        chain = repair_chain(tree, h.id)
        ok = [n for n in chain if n.ok]
        if ok:
            cand = min(ok, key=lambda n: n.ms)
            if best is None or cand.ms < best.ms:
                best = cand
        else:
            repairs = len(chain) - 1
            last = chain[-1]
            v = last.verdict if last.spec is not None else "no valid spec"
            worst_verdicts.append(f"{v} after {repairs} repair{'s' if repairs != 1 else ''}" if repairs else v)
    parts = []
    if best is not None:
        if parent is not None and math.isfinite(parent.ms):
            parts.append(f"ok {parent.ms / best.ms:.2f}x vs parent ({best.ms:.4g} ms)")
        else:
            f = tree.figures(best)
            sp = f["speedup_eager"]
            parts.append(f"ok {best.ms:.4g} ms" + (f", {sp:.2f}x vs eager" if sp else ""))
    if worst_verdicts:
        parts.append(f"{len(worst_verdicts)}/{len(heads)} branches failed: " + "; ".join(worst_verdicts))
    return "; ".join(parts)
