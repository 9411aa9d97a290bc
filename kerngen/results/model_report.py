"""``kerngen report RUN`` for a model run (issue 34): one self-contained HTML file. The regions as two bars of time,
before (every region as PyTorch, the eager baseline's step times) and after (each region as the run left it: its
kernel's time, or PyTorch's), the table per region (share of eager time, roofline floor, what each variant and
configuration gave, kernel or PyTorch and why, Amdahl bound), the end-to-end check and times. No script, font or
image is loaded; everything from the record is escaped by the template engine (autoescape) and stripped of
control sequences. Nothing is imported or run.
"""

from __future__ import annotations

import colorsys
from pathlib import Path
from typing import Any

from kerngen.errors import KerngenError
from kerngen.redact import printable

from kerngen.agent.model_run import ModelRun, RegionRow
from kerngen.harness.atomic import write_atomic

__all__ = ["bars", "render_model_report", "write_model_report"]

WIDTH = 900  # px of the longer bar

_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>kerngen model run {{ run.id }}</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}.k{color:#075}.p{color:#777}
small{color:#555}</style></head><body>
<h1>Model run {{ run.id }}</h1>
<p>{{ run.problem }} on {{ run.device }}; started {{ run.started }}; {{ "%.0f"|format(run.elapsed_s) }} s;
{{ run.stopped }}</p>
<p><b>End to end: {{ "correct" if run.check and run.check.ok else "NOT correct" }}</b>
{% if run.check %}({{ run.check.message }}){% endif %}<br>
kerngen kernels: {{ "%.1f"|format(100 * run.kernel_share) }}% of the eager step time; Amdahl bound
{{ run.amdahl_text }}<br>
{% if t %}eager {{ ms(t.eager_ms) }} ms, torch.compile {{ ms(t.compile_ms) }} ms, kerngen {{ ms(t.kerngen_ms) }} ms,
kerngen + torch.compile {{ ms(t.kerngen_compile_ms) }} ms{% if t.compile_ms %};
{{ "%.2f"|format(t.compile_ms / t.best_ms) }}x torch.compile{% endif %}{% for n in t.notes %}; {{ n }}{% endfor %}
{% else %}not timed end to end{% endif %}</p>
<h2>Time by region, before and after (sum of the steps, each timed alone)</h2>
<svg width="{{ width + 160 }}" height="{{ 34 * (bars|length) + 10 }}" xmlns="http://www.w3.org/2000/svg">
{% for bar in bars %}<text x="0" y="{{ 34 * loop.index0 + 22 }}">{{ bar.label }}</text>
{% for seg in bar.segments %}<rect x="{{ 90 + seg.x }}" y="{{ 34 * loop.index0 + 8 }}" width="{{ seg.w }}"
 height="22" fill="{{ seg.color }}" stroke="#fff"><title>{{ seg.title }}</title></rect>{% endfor %}
<text x="{{ 96 + bar.width }}" y="{{ 34 * loop.index0 + 24 }}">{{ "%.4f"|format(bar.ms) }} ms</text>
{% endfor %}</svg>
<h2>Regions</h2>
<table><tr><th>region</th><th>nodes</th><th>family</th><th>share</th><th>eager ms</th><th>floor ms</th><th>weight</th>
<th>budget s</th><th>kernel ms</th><th>runs</th><th>Amdahl</th><th>tried</th></tr>
{% for r in run.regions %}<tr><td>r{{ r.region }}</td><td>{{ r.nodes|join(", ") }}</td><td>{{ r.family or "-" }}</td>
<td>{{ "%.1f"|format(100 * r.share) }}%</td><td>{{ ms(r.eager_ms) }}</td><td>{{ ms(r.floor_ms) }}</td>
<td>{{ "%.3f"|format(r.weight) }}</td><td>{{ "%.1f"|format(r.budget_s) }}</td><td>{{ ms(r.kernel_ms) }}</td>
<td>{% if r.chosen == "kernel" %}<span class="k">kernel {{ r.variant }}</span>{% if r.config %}<br><small>
{{ cfg(r.config) }}</small>{% endif %}{% else %}<span class="p">PyTorch</span><br><small>{{ r.why }}</small>
{% endif %}</td><td>{{ r.amdahl_text }}</td>
<td><small>{% for v in r.tried %}{{ v.variant }}{% if v.config %} [{{ cfg(v.config) }}]{% endif %}:
{{ ms(v.kernel_ms) + " ms" if v.ok else v.message }}<br>{% endfor %}</small></td></tr>
{% endfor %}</table></body></html>
"""


def _ms(v: float | None) -> str:
    return f"{v:.4f}" if v is not None else "-"


def _color(i: int, kernel: bool) -> str:
    r, g, b = colorsys.hls_to_rgb((i * 0.137) % 1.0, 0.45 if kernel else 0.75, 0.55 if kernel else 0.15)
    return f"#{int(255 * r):02x}{int(255 * g):02x}{int(255 * b):02x}"


def bars(run: ModelRun, width: int = WIDTH) -> list[dict[str, Any]]:
    """Two bars (before: every region's eager time; after: a kernel region's kernel time, else its eager time), the
    views between regions last in each; segments scaled so the longer bar is ``width`` px."""
    def after(r: RegionRow) -> float:
        return r.kernel_ms if r.chosen == "kernel" and r.kernel_ms is not None else r.eager_ms

    rows = [("before", [(r, max(0.0, r.eager_ms)) for r in run.regions]),
            ("after", [(r, max(0.0, after(r))) for r in run.regions])]
    totals = [sum(ms for _, ms in segs) + max(0.0, run.views_ms) for _, segs in rows]
    scale = width / max(max(totals), 1e-12)
    out = []
    for (label, segs), total in zip(rows, totals):
        x, parts = 0.0, []
        for r, ms in segs:
            kernel = label == "after" and r.chosen == "kernel"
            how = f"kernel {r.variant}" if kernel else "PyTorch"
            parts.append({"x": round(x, 2), "w": round(ms * scale, 2), "color": _color(r.region, kernel),
                          "title": printable(f"r{r.region} {r.family or '-'} {how}: {ms:.4f} ms")})
            x += ms * scale
        if run.views_ms > 0:
            parts.append({"x": round(x, 2), "w": round(run.views_ms * scale, 2), "color": "#ddd",
                          "title": f"views between regions: {run.views_ms:.4f} ms"})
        out.append({"label": label, "segments": parts, "ms": total, "width": round(total * scale, 2)})
    return out


def render_model_report(run: ModelRun) -> str:
    import jinja2

    # every value printed loses its control sequences, then is escaped
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                             finalize=lambda v: printable(v) if isinstance(v, str) else v)
    return env.from_string(_TEMPLATE).render(run=run, t=run.timing, bars=bars(run), width=WIDTH, ms=_ms,
                                             cfg=lambda c: " ".join(f"{k}={v}" for k, v in c.items()))


def write_model_report(run: ModelRun, folder: Path, out: str | Path | None = None) -> Path:
    """The report at ``out`` (a file, or a folder to write ``RUN_ID.html`` into; default: ``RUN/report.html``)."""
    path = Path(out) if out is not None else Path(folder) / "report.html"
    if path.is_dir():
        path = path / f"{run.id}.html"
    try:
        write_atomic(path, render_model_report(run))
    except OSError as exc:
        raise KerngenError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
    return path
