"""``kerngen report RUN``: one self-contained HTML file of a run.

The tree of ideas (each node with its idea, verdict, time, speedup, registers, spills, source and
a diff against its parent), best-so-far over rounds and over GPU time, the autotuning curves, a
roofline chart, the problem (as the run recorded it), and the run's configuration, GPU and
versions. No script, font or image is loaded from anywhere: CSS is inline and the charts are
inline SVG. Everything that comes from the run (ideas and sources come from an LLM, the journal
from anyone) is HTML-escaped by the template engine (autoescape) and has its terminal control
sequences removed. Nothing is imported: the problem's FLOPs and bytes come from the journal's
record (:mod:`kerngen.agent.problem_data`), never from the run's problem file.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

from kerngen.agent.journal import DEMO_LABEL, NodeEvaluated, NodeProfiled, NodeTuned, RoundFinished, write_atomic
from kerngen.results.report_charts import Point, RooflineData, Series
from kerngen.results.show import TIMED_KERNEL, precision_line, profile_text, spent_wall_s
from kerngen.results.speedups import speedup_line
from kerngen.agent.tree import Node, Run
from kerngen.errors import KerngenError, ProblemError
from kerngen.redact import printable
from kerngen.harness.spec.spec import KernelSpec

class ReportError(KerngenError):
    """The report cannot be written where it was asked to go."""


MAX_DIFF_LINES = 4000  # a longer source gets no diff (difflib is quadratic: a journal must not hang it)

TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE = "report_template.html.j2"


# ----- numbers for the charts -----------------------------------------------------------------
def _eager_ms(run: Run) -> float | None:
    b = run.baseline
    return b.eager.median_ms if b is not None and b.eager.median_ms > 0 else None


def _score(run: Run, ms: float) -> float:
    """What the charts plot: speedup vs eager when a baseline exists, else ms."""
    eager = _eager_ms(run)
    return eager / ms if eager else ms


def progress_series(run: Run) -> tuple[Series, Series]:
    """(best per round, every correct result over cumulative GPU seconds). GPU seconds are the
    workers' wall time of each evaluation and of each configuration the tuner tried."""
    by_round = Series(name="best per round")
    for ev in run.events:
        if isinstance(ev, RoundFinished) and ev.best_ms and math.isfinite(ev.best_ms):
            by_round.points.append(Point(x=ev.round, y=_score(run, ev.best_ms)))
    by_gpu = Series(name="over GPU time")
    gpu_s = 0.0
    for ev in run.events:
        if isinstance(ev, NodeEvaluated):
            gpu_s += ev.result.wall_s
            ok = ev.result.ok and math.isfinite(ev.result.ms)
            by_gpu.points.append(Point(x=gpu_s, y=_score(run, ev.result.ms) if ok else 0.0, ok=ok,
                                       label=f"#{ev.id}"))
        elif isinstance(ev, NodeTuned):
            gpu_s += ev.gpu_seconds() if ev.result is not None else 0.0  # as the search counts it
            ok = ev.result is not None and ev.result.ok
            if ok:
                by_gpu.points.append(Point(x=gpu_s, y=_score(run, ev.result.ms), label=f"#{ev.id} tuned"))
        elif isinstance(ev, NodeProfiled):
            gpu_s += ev.gpu_seconds()  # as the search counts it: the GPU was held for the profile
    return by_round, by_gpu


def tuning_series(run: Run) -> list[Series]:
    """One series per tuned node: the time of each configuration tried (x: evaluations so far).
    A journal whose curve holds only the best so far (the real tuner's older shape) plots that."""
    out = []
    for node_id, ev in sorted(run.tuned.items()):
        if ev.outcome() is None:
            continue  # the tuner found nothing: no curve to draw
        per_config = any(p.ms is not None for p in ev.curve)
        s = Series(name=f"#{node_id}" if per_config else f"#{node_id} (best so far)")
        for p in ev.curve:
            y = p.ms if per_config else p.best_ms
            ok = (p.ok if per_config else y is not None) and y is not None and math.isfinite(y)
            s.points.append(Point(x=p.evals, y=float(y) if ok else 0.0, ok=ok))  # type: ignore[arg-type]
        out.append(s)
    return out


def _problem_info(run: Run) -> Any:
    """The run's recorded problem (or a built-in's own description), None when it has neither."""
    from kerngen.agent.problem_data import recorded_info

    try:
        return recorded_info(run.started)
    except ProblemError:
        return None  # an older run of a problem file: draw what the journal knows


def _problem_counts(run: Run) -> tuple[float | None, float | None]:
    """(flops, min_bytes): from the baseline, else from the problem as the run recorded it, else
    min_bytes from a memory-bound floor (floor_ms x copy bandwidth)."""
    b, gpu = run.baseline, run.tree.gpu
    flops = b.flops if b else None
    nbytes = float(b.min_bytes) if b and b.min_bytes else None
    if flops is None or nbytes is None:
        info = _problem_info(run)
        if info is not None:
            flops = flops if flops is not None else info.flops
            nbytes = nbytes if nbytes is not None else float(info.min_bytes)
    measured_floor = b is not None and not b.floor_basis  # an older run's floor: from the measured copy
    if nbytes is None and measured_floor and b.floor_ms and b.floor_bound == "memory" and gpu and gpu.copy_gbps:
        nbytes = b.floor_ms * 1e-3 * gpu.copy_gbps * 1e9
    return flops, nbytes


def roofline_data(run: Run) -> RooflineData | None:
    from kerngen.harness.gpu.roofline import compute_rate_tflops, peak_bandwidth, peak_rate

    flops, nbytes = _problem_counts(run)
    if not nbytes:
        return None
    gpu, b = run.tree.gpu, run.baseline
    dtype = run.tree.dtype() or "float32"
    rate = peak_rate(dtype, gpu) if gpu else None
    bw = peak_bandwidth(gpu) if gpu else None
    data = RooflineData(flops=flops, min_bytes=nbytes, copy_gbps=bw[0] if bw else None,
                        peak_tflops=rate[0] if rate else None,
                        roof_label="; ".join(x[1] for x in (bw, rate) if x) or "unknown",
                        measured_gbps=gpu.copy_gbps if gpu else None,
                        measured_tflops=compute_rate_tflops(dtype, gpu) if gpu else None)
    data.kernels = [Point(x=n.id, y=n.ms, label=f"#{n.id}") for n in run.tree.ranked()]
    if b is not None:
        data.references.append(Point(x=0, y=b.eager.median_ms, label="PyTorch eager"))
        if b.compiled is not None:
            data.references.append(Point(x=0, y=b.compiled.median_ms, label="torch.compile"))
    return data


def charts(run: Run) -> dict[str, str | None]:
    from kerngen.results import report_charts as rc

    ylabel = "speedup vs eager" if _eager_ms(run) else "median ms"
    by_round, by_gpu = progress_series(run)
    roof = roofline_data(run)
    return {
        "progress": rc.progress_chart(by_round, by_gpu, ylabel),
        "tuning": rc.tuning_chart(tuning_series(run)),
        "roofline": rc.roofline_chart(roof) if roof else None,
    }


# ----- the tree -------------------------------------------------------------------------------
def plan_text(spec: KernelSpec) -> str:
    """The spec without its source: what the diff shows under the source's."""
    data = spec.model_dump(mode="json", exclude={"source", "name", "description"})
    steps = data.pop("steps")
    # one line per field and per step: short to read, and a diff points at the step that changed
    lines = [f"{k}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(data.items())]
    lines += [f"step {i}: {json.dumps(st, sort_keys=True)}" for i, st in enumerate(steps)]
    return "\n".join(lines)


def spec_diff(parent: KernelSpec | None, child: KernelSpec | None, pid: int | None, cid: int) -> list[str]:
    """Unified diff of source then plan, parent -> child; [] when there is nothing to compare."""
    if parent is None or child is None:
        return []
    lines: list[str] = []
    for what, a, b in (("kernel.cu", parent.source, child.source), ("plan.json", plan_text(parent), plan_text(child))):
        if max(a.count("\n"), b.count("\n")) > MAX_DIFF_LINES or max(len(a), len(b)) > 100 * MAX_DIFF_LINES:
            lines.append(f"({what}: too long to diff here)")
            continue
        lines += difflib.unified_diff(a.splitlines(), b.splitlines(), fromfile=f"#{pid} {what}",
                                      tofile=f"#{cid} {what}", lineterm="")
    return lines


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "dh"
    if line.startswith("@@"):
        return "dr"
    return {"+": "da", "-": "dd"}.get(line[:1], "")


def node_view(run: Run, n: Node, best_id: int | None) -> dict[str, Any]:
    """One node's card (its children are items of :func:`tree_view` after it)."""
    f = run.tree.figures(n)
    r = n.best_result
    worst = r.compile.worst() if r is not None and r.compile is not None and r.compile.kernels else None
    parent = run.nodes.get(n.parent) if n.parent is not None else None
    diff = spec_diff(parent.spec if parent else None, n.spec, n.parent, n.id)
    t = r.timing if r is not None and r.ok else None
    return {
        "id": n.id, "parent": n.parent, "round": n.round, "kind": n.kind, "attempt": n.attempt,
        "idea": n.idea.text if n.idea else "", "category": n.idea.category.value if n.idea else "",
        "expected": n.idea.expected_effect if n.idea else "",
        "verdict": n.verdict, "best": n.id == best_id, "tuned": n.tuned_ok,
        "message": (r.message if r is not None else n.error) or n.error,
        "ms": f["ms"], "iqr": t.iqr_ms if t else None, "speedup_eager": f["speedup_eager"],
        "speedup_compile": f["speedup_compile"], "pct_roofline": f["pct_roofline"],
        "registers": worst.registers if worst else None, "spills": worst.spill_stores if worst else None,
        "config": n.config, "source": n.spec.source if n.spec else "",
        "plan": plan_text(n.spec) if n.spec else "", "notes": n.notes,
        "profile": profile_text(n.profile) if n.profile is not None else "",
        "diff": [(_diff_class(l), l) for l in diff],
    }


def tree_view(run: Run) -> list[dict[str, Any]]:
    """The tree in pre-order, walked with a stack, not by recursion (a legitimately deep run, a
    chain of 300 repairs and refinements, renders like any other): each node's card, whether its
    children follow (``opens``: the template opens a list) and how many lists close after it
    (``closes``). A journal that makes a node its own ancestor shows each node once."""
    best = run.best
    best_id = best.id if best else None
    seen: set[int] = set()
    out: list[dict[str, Any]] = []
    stack = [iter(sorted(run.tree.roots(), key=lambda n: n.id))]
    while stack:
        n = next(stack[-1], None)
        if n is None:
            stack.pop()
            if stack:  # a list of children ends: it closes after the last card written
                out[-1]["closes"] += 1
            continue
        if n.id in seen:
            continue
        seen.add(n.id)
        kids = [run.nodes[c] for c in sorted(set(n.children)) if c in run.nodes and c not in seen]
        out.append(node_view(run, n, best_id) | {"opens": bool(kids), "closes": 0})
        if kids:
            stack.append(iter(kids))
    return out


def problem_view(run: Run) -> dict[str, Any] | None:
    """The problem as the run recorded it (name, description, tensors, sizes, FLOPs, bytes, source)."""
    info = _problem_info(run)
    if info is None:
        return None
    record = run.started.problem_info
    label = lambda t: f"{t.name}: {t.dtype}[{', '.join(str(d) for d in t.shape)}]"  # noqa: E731
    return {
        "name": info.name, "description": info.description, "dtype": info.dtype,
        "inputs": [label(t) for t in info.inputs], "params": [label(t) for t in info.params],
        "outputs": [label(t) for t in info.outputs],
        "sizes": ", ".join(f"{k}={v}" for k, v in info.sizes.items()),
        "flops": info.flops, "min_bytes": info.min_bytes, "tolerance": f"atol={info.atol:g} rtol={info.rtol:g}",
        "builtin": info.builtin, "sha256": record.sha256 if record is not None else "",
        "source": record.source if record is not None else "",
    }


# ----- the page -------------------------------------------------------------------------------
def _facts(run: Run) -> dict[str, Any]:
    st = run.started
    gpu = run.tree.gpu.model_dump(mode="json") if run.tree.gpu else {}
    return {
        "search": st.config.model_dump(mode="json"), "budget": st.budget.model_dump(mode="json"),
        "versions": dict(st.versions), "gpu": gpu, "argv": " ".join(st.argv),
        "proposer": st.proposer + (f" ({st.model})" if st.model else ""), "replay_of": st.replay_of or "",
    }


def _tuning_tables(run: Run) -> list[dict[str, Any]]:
    """Per tuned node: what it kept, how long it took, and every configuration tried."""
    out = []
    for nid, ev in sorted(run.tuned.items()):
        o = ev.outcome()
        if o is None:
            continue
        node = run.nodes.get(nid)
        before = node.result.ms if node is not None and node.result is not None and node.result.ok else None
        out.append({
            "id": nid, "best": ", ".join(f"{k}={v}" for k, v in o.config.items()), "ms": o.result.ms,
            "before_ms": before, "gain": before / o.result.ms if before and o.result.ms > 0 else None,
            "evaluated": o.evaluated, "seconds": o.gpu_seconds(),
            "rows": [{"evals": p.evals, "config": ", ".join(f"{k}={v}" for k, v in (p.config or {}).items()) or "-",
                      "ms": p.ms, "verdict": p.verdict or "-", "best_ms": p.best_ms, "seconds": p.seconds}
                     for p in o.curve],
        })
    return out


def context(run: Run) -> dict[str, Any]:
    best = run.best
    b = run.baseline
    verdicts: dict[str, int] = {}
    for n in run.nodes.values():
        verdicts[n.verdict] = verdicts.get(n.verdict, 0) + 1
    return {
        "run_id": run.id, "problem": run.tree.problem.label() if run.tree.problem else "?",
        "gpu_name": run.tree.gpu.name if run.tree.gpu else "?",
        "status": f"finished: {run.finished.reason}" if run.finished else "unfinished",
        "baseline": b.model_dump(mode="json") if b else None,
        "best": {"id": best.id, "idea": best.idea.text if best.idea else "", "config": best.config,
                 **run.tree.figures(best)} if best else None,
        "verdicts": sorted(verdicts.items()), "nodes": len(run.nodes), "rounds": len(run.tree.rounds_finished),
        "elapsed_min": spent_wall_s(run) / 60,  # the same minutes as `kerngen show`
        "demo": DEMO_LABEL if run.started.demo else "", "usage": run.finished.usage if run.finished else {},
        "tree": tree_view(run), "charts": charts(run), "tuning": _tuning_tables(run), "facts": _facts(run),
        "problem_info": problem_view(run),
        "best_line": speedup_line(run.tree.figures(best)) if best else "",
        "precision": precision_line(run.tree.problem.precision if run.tree.problem else None),
        "timed": TIMED_KERNEL,
    }


def _clean(value: Any) -> Any:
    """Every string of a context without terminal control sequences (the HTML escapes the rest)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clean(v) for v in value)
    return value


def _fmt(value: Any, spec: str = ".4g", suffix: str = "") -> str:
    """A number as text ("-" for none): milliseconds (the default) to 4 significant digits."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-" if value is None or isinstance(value, (int, float)) else str(value)
    if spec == ".4g" and abs(value) >= 1e4:
        return f"{value:,.0f}{suffix}"  # never 1.235e+04 for a time
    return f"{value:{spec}}{suffix}"


def _num(value: Any) -> str:
    """Any value of a configuration table: floats to 4 significant digits, large ints grouped."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 1e5 else str(value)
    if isinstance(value, float):
        return _fmt(value, ".4g") if abs(value) < 1e6 else f"{value:.4g}"
    return str(value)


def render(run: Run) -> str:
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = _fmt
    env.filters["num"] = _num
    env.filters["cfg"] = lambda c: ", ".join(f"{k}={v}" for k, v in (c or {}).items()) or "-"
    ctx = context(run)
    charts_svg = ctx.pop("charts")
    ctx = _clean(ctx)
    # our own matplotlib output (numbers and our own labels only), the only unescaped text of the page
    ctx["charts"] = {k: Markup(v) if v else None for k, v in charts_svg.items()}
    return env.get_template(TEMPLATE).render(**ctx)


def write_report(run: Run, out: str | Path | None = None) -> Path:
    """Render ``run`` to ``out`` (default: ``<run>/report.html``; a folder: ``<out>/<run id>.html``);
    returns the path written."""
    path = Path(out) if out is not None else run.path / "report.html"
    if path.is_dir() or (out is not None and str(out).endswith(("/", "\\"))):
        path = path / f"{run.id}.html"  # a folder, existing or meant (a trailing slash): the report goes inside
    if not path.parent.is_dir():
        raise ReportError(f"cannot write {path}: no folder {path.parent}")
    write_atomic(path, render(run))
    return path


__all__ = ["render", "write_report", "context", "spec_diff", "progress_series", "roofline_data"]
