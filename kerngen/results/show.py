"""``kerngen show RUN``: the tree of a run (ideas, categories, verdicts, ms, speedups, registers),
rendered with rich. Needs no GPU: everything comes from the journal, and nothing is imported
(a run's problem file never is).

A journal may come from anyone and its texts from a model: every text taken from it goes
through :func:`_say` (terminal control sequences removed, rich markup escaped)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree as RichTree

from kerngen.text import strict_json
from kerngen.agent.journal import DEMO_LABEL, NodeProfiled, is_appending
from kerngen.agent.run_files import TIMED
from kerngen.agent.tree import Node, Run, Tree, load_run, run_folders
from kerngen.problems.torch_modes import DEFAULTS_LABEL, precision_of
from kerngen.redact import printable
from kerngen.results.llm_record import causes_text, estimated_tokens, no_answer_causes
from kerngen.results.speedups import SHORT_NOTE, speedup_line

TIMED_KERNEL = f"{TIMED}; kerngen bench PROBLEM --kernel SPEC times both side by side"


def precision_line(precision: str | None) -> str:
    """What a run's kernels were checked against, in a few words."""
    p = precision_of(precision)
    return ("true fp32 (TF32 off in the reference; fp32 atol = rtol = 1e-4)" if p.value == "fp32" else
            "TF32 (PyTorch's TF32 reference, tolerance measured against fp64 with a margin of 4; --precision tf32)")

_COLOR = {"ok": "green", "incorrect": "red", "invalid_spec": "magenta", "compile_error": "magenta",
          "runtime_error": "red", "harness_error": "magenta", "timeout": "yellow", "invalid": "bright_black", "pending": "cyan"}


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
        dflt = f["speedup_compile_defaults"] or f["speedup_eager_defaults"]
        if dflt and f["speedup_compile_defaults"] != f["speedup_compile"]:  # only where TF32 changes PyTorch
            parts.append(f"({dflt:.2f}x {'compile' if f['speedup_compile_defaults'] else 'eager'} at defaults)")
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


def profile_text(ev: NodeProfiled) -> str:
    """A profiled node in one line (show, report): Nsight Compute's metrics per kernel, or why none."""
    if not ev.profiles:
        return f"profile (ncu): none: {ev.error or 'no kernel reported'}"
    many = len(ev.profiles) > 1
    kernels = [(f"{p.name} " if many else "") + (f"{p.duration_ms:.4g} ms: " if p.duration_ms is not None else "")
               + p.line() for p in ev.profiles]
    return "profile (ncu): " + " | ".join(kernels)


def _short(text: str, width: int) -> str:
    line = " ".join(printable(text or "").split())
    return line if len(line) <= width else line[: width - 3] + "..."


def _add_chain(tree: Tree, branch: Any, n: Node, best_id: int | None) -> None:
    """``n`` and its repairs under ``branch``, walked with a stack (a chain of any length)."""
    seen: set[int] = set()
    todo = [(branch, n)]
    while todo:
        under, m = todo.pop()
        if m.id in seen:  # a journal that makes a node its own ancestor: show it once
            continue
        seen.add(m.id)
        sub = under.add(node_label(tree, m, best_id))
        if m.profile is not None:
            sub.add(f"[dim]{_say(profile_text(m.profile))}[/]")
        repairs = [c for c in (tree.nodes.get(cid) for cid in m.children) if c is not None and c.kind == "repair"]
        todo.extend((sub, c) for c in reversed(repairs))


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
    if st.demo:
        t.add_row("[bold red]DEMO[/]", f"[bold red]{DEMO_LABEL}[/]: toy kernels, made-up times")
    if st.dry_run:
        t.add_row("[bold yellow]DRY RUN[/]", _say(f"compiled for {st.dry_run}, nothing run: no times, no baseline"))
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
    t.add_row("checked at", _say(precision_line(tree.problem.precision if tree.problem else None)))
    b = tree.baseline
    if b is not None and math.isfinite(b.eager.median_ms):  # a dry run's baseline holds no time
        comp = f"{b.compiled.median_ms:.4f} ms" if b.compiled else _say(_short(f"n/a {b.compile_error}", 110))
        sheet = ", data-sheet rates" if tree.gpu is not None and tree.gpu.datasheet else ""  # a dry run's preset
        floor = f"{b.floor_ms:.4f} ms ({_say(b.floor_basis or b.floor_bound)}{sheet})" if b.floor_ms else "n/a"
        if b.floor_measured_ms:
            floor += f"; {b.floor_measured_ms:.4f} ms from the measured ceilings"
        t.add_row("baseline", f"true fp32: eager {b.eager.median_ms:.4f} ms, torch.compile {comp}, floor {floor}")
        if b.eager_defaults is not None:
            same = " (the same kernels: no op of the problem uses TF32)" if b.defaults_same else ""
            comp_d = f", torch.compile {b.compiled_defaults.median_ms:.4f} ms" if b.compiled_defaults else ""
            t.add_row("", _say(f"{b.defaults_label}: eager {b.eager_defaults.median_ms:.4f} ms{comp_d}{same}"))
    best = tree.best()
    if best is not None:
        f = tree.figures(best)
        bits = [f"#{best.id} {best.ms:.4f} ms"]
        if f["pct_roofline"]:
            bits.append(f"{f['pct_roofline']:.0f}% of roofline")
        t.add_row("best", ", ".join(bits))
        line = speedup_line(f)
        if line:
            t.add_row("", _say(line))
        t.add_row("timed", _say(TIMED_KERNEL))
    else:
        t.add_row("best", "no correct kernel yet")
    verdicts: dict[str, int] = {}
    for n in tree.nodes.values():
        verdicts[n.verdict] = verdicts.get(n.verdict, 0) + 1
    t.add_row("nodes", f"{len(tree.nodes)}: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))
    status = (f"finished{_kind(tree.finished)}: {_say(_short(tree.finished.reason, 200))}" if tree.finished
              else "unfinished (continue with --resume)")
    if run.truncated:
        status += f"; a partial last event ({run.truncated} bytes) is ignored"
    t.add_row("status", f"{status}; {run.sessions} session(s)")
    causes = no_answer_causes(run)
    if causes:  # questions the LLM never answered, and why (an endpoint error, a budget)
        t.add_row("no answer", _say(f"{sum(causes.values())}: {causes_text(causes)}"))
    if tree.finished and tree.finished.usage:
        u = tree.finished.usage
        cost = f", ${u['cost_usd']:.4f}" if isinstance(u.get("cost_usd"), (int, float)) else ""
        est = estimated_tokens(u)
        tokens = f"{_count(u.get('tokens'))} tokens" + (f" ({est} estimated: billed, never answered)" if est else "")
        t.add_row("spent", f"{_count(u.get('llm_calls'))} LLM requests, {tokens}{cost}, "
                           f"{u.get('gpu_s', 0) / 60:.1f} GPU min, {spent_wall_s(run) / 60:.1f} wall min")
    return t


def _kind(finished: Any) -> str:
    """`` (llm_error)``: the stop's kind, for a reader who scans for it (none in old journals)."""
    stop = getattr(finished, "stop", None)
    return f" ({_say(stop.value)})" if stop is not None else ""


def spent_wall_s(run: Run) -> float:
    """Wall seconds of a run, as show and report print them: the budget's count when the run
    finished and recorded it, else the span of its sessions' events."""
    u = run.finished.usage if run.finished else {}
    wall = u.get("wall_s") if u else None
    return float(wall) if isinstance(wall, (int, float)) and math.isfinite(wall) else run.elapsed_s()


def _count(value: object) -> str:
    """A recorded count as an integer ("?" for what a journal should not hold: inf, NaN, text)."""
    return str(int(value)) if isinstance(value, (int, float)) and math.isfinite(value) else "0" if value is None else "?"


def render(run: Run) -> Group:
    return Group(render_header(run), render_tree(run))


# ----- kerngen runs -------------------------------------------------------------------------
def run_row(path: Path) -> dict[str, Any]:
    """What ``kerngen runs`` says of one run folder, read from its journal as data (its problem
    file is never imported). A run that does not load is a row with status ``corrupt: ...``."""
    row: dict[str, Any] = {"run": path.name, "path": str(path), "problem": None, "gpu": None, "best_ms": None,
                           "speedup_eager": None, "speedup_compile": None, "speedup_eager_defaults": None,
                           "speedup_compile_defaults": None, "state": "corrupt", "stop": None, "status": ""}
    try:
        run = load_run(path)
        tree = run.tree
        row["run"] = run.id
        row["problem"] = tree.problem.label() if tree.problem else None
        row["gpu"] = tree.gpu.name if tree.gpu else None
        row["dry_run"] = run.started.dry_run  # the GPU preset a dry run compiled for (nothing measured)
        best = tree.best()
        if best is not None:
            f = tree.figures(best)
            row.update(best_ms=f["ms"], speedup_eager=f["speedup_eager"], speedup_compile=f["speedup_compile"],
                       speedup_eager_defaults=f["speedup_eager_defaults"],
                       speedup_compile_defaults=f["speedup_compile_defaults"])
        if tree.finished is not None:
            stop = tree.finished.stop
            row["state"], row["status"] = "finished", f"finished{_kind(tree.finished)}: {tree.finished.reason}"
            row["stop"] = stop.value if stop is not None else None
        else:
            row["state"] = row["status"] = "running" if is_appending(path) else "unfinished"
    except Exception as exc:  # noqa: BLE001 - a folder from anyone: one row, never a crash
        row["status"] = f"corrupt: {exc}" if str(exc) else f"corrupt: {type(exc).__name__}"
    row["status"] = _short(row["status"], 200)
    return strict_json(row)


def list_runs(runs_dir: str | Path = "runs") -> list[dict[str, Any]]:
    """One row per run folder under ``runs_dir``, oldest first (the last is ``latest``)."""
    return [run_row(p) for p in run_folders(runs_dir)]


def _num(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:{spec}}{suffix}"


def render_runs(rows: list[dict[str, Any]], runs_dir: str | Path = "runs") -> Group:
    """The table of ``kerngen runs`` (fits 80 columns), then a line per corrupt run saying why."""
    from rich import box

    table = Table(title=f"runs under {_say(runs_dir)}, oldest first (the last is 'latest')", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=0,  # the box puts a space between columns
                  caption=SHORT_NOTE.format(label=DEFAULTS_LABEL), caption_justify="left")
    table.add_column("run\nproblem", min_width=30, overflow="fold")  # folded, never cut
    table.add_column("GPU", min_width=8, max_width=12)
    for col in ("best\nms", "fp32\neager", "fp32\ncomp.", "dflt\ncomp."):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    colors = {"finished": "green", "corrupt": "red"}
    for r in rows:
        state = r["state"] + (f" ({r['stop']})" if r.get("stop") else "")  # why it stopped, by kind
        status = f"[{colors.get(r['state'], 'yellow')}]{_say(state)}[/]"
        gpu = r["gpu"] or "?"
        if gpu.startswith("scripted evaluator"):
            gpu = "none (scripted demo)"
        if r.get("dry_run"):
            gpu = f"none (dry run, {r['dry_run']})"
        table.add_row(f"{_say(r['run'])}\n[dim]{_say(r['problem'] or '?')}[/]", _say(gpu), _num(r["best_ms"], ".4f"),
                      _num(r["speedup_eager"], ".2f", "x"), _num(r["speedup_compile"], ".2f", "x"),
                      _num(r["speedup_compile_defaults"], ".2f", "x"), status)
    notes = [f"[red]{_say(r['run'])}[/]: {_say(r['status'])}" for r in rows if r["state"] == "corrupt"]
    return Group(table, *notes)


def run_json(run: Run) -> dict[str, Any]:
    """``kerngen show --json``: the run's tree (as ``tree.json`` holds it) with its path, proposer,
    sessions, status and the best node's figures; non-finite numbers become null."""
    tree = run.tree
    best = tree.best()
    st = run.started
    data = tree.to_json() | {
        "path": str(run.path),
        "proposer": st.proposer,
        "model": st.model,
        "replay_of": st.replay_of,
        "sessions": run.sessions,
        "status": "finished" if tree.finished else "unfinished",
        "stop": ({"kind": tree.finished.stop.value if tree.finished.stop is not None else None,
                  "reason": tree.finished.reason} if tree.finished else None),
        "no_answer": dict(no_answer_causes(run)),
        "truncated_bytes": run.truncated,
        "best_figures": tree.figures(best) if best is not None else None,
        "usage": tree.finished.usage if tree.finished else None,
    }
    return strict_json(data)


def verdict_counts(verdicts: Iterable[str]) -> dict[str, int]:
    """Verdicts counted, most frequent first (ties by name)."""
    counts = Counter(verdicts)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def counts_text(counts: dict[str, int]) -> str:
    """``12 candidates: 7 compile_error, 5 incorrect`` (``no candidates`` when empty)."""
    total = sum(counts.values())
    if not total:
        return "no candidates"
    return f"{total} candidate{'s' if total != 1 else ''}: " + ", ".join(f"{n} {v}" for v, n in counts.items())


def no_kernel_why(run: Run) -> str:
    """Why a run has no correct kernel, in one line: what became of its candidates."""
    return "no correct kernel: " + counts_text(verdict_counts(n.verdict for n in run.nodes.values()))
