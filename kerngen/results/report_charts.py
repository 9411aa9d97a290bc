"""The charts of ``kerngen report`` as inline SVG (matplotlib, Agg backend): nothing is loaded
from outside the HTML file. Fonts are drawn as paths, so the SVG needs no font either.

Every chart takes plain numbers (see :mod:`kerngen.results.report` for where they come from) and
returns the ``<svg ...>...</svg>`` element as text, or None when there is nothing to draw. Only
numbers and our own labels reach a chart, never text from a run (ideas come from an LLM).
"""

from __future__ import annotations

import io
import re
from typing import Sequence

from pydantic import BaseModel, Field

_STYLE = {"svg.fonttype": "path", "svg.hashsalt": "kerngen", "font.size": 9, "axes.grid": True,
          "grid.alpha": 0.3, "figure.dpi": 96}


class Point(BaseModel):
    x: float
    y: float
    label: str = ""
    ok: bool = True


class Series(BaseModel):
    name: str
    points: list[Point] = Field(default_factory=list)


class RooflineData(BaseModel):
    """Kernels placed against the GPU's ceilings. ``flops`` None: a bandwidth chart instead."""

    flops: float | None
    min_bytes: float
    copy_gbps: float | None  # the roof: the data sheet's bandwidth and rate (kerngen.harness.gpu.roofline)
    peak_tflops: float | None
    roof_label: str = "data-sheet peaks"
    measured_gbps: float | None = None  # the ceilings the harness measured (device copy, cuBLAS), beside it
    measured_tflops: float | None = None
    kernels: list[Point] = Field(default_factory=list)  # x: node id, y: ms
    references: list[Point] = Field(default_factory=list)  # eager / torch.compile: x unused, y: ms


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def to_svg(fig) -> str:
    """The figure as an ``<svg>`` element (XML declaration and DOCTYPE stripped)."""
    plt = _pyplot()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    # Inline SVG in HTML needs neither the RDF metadata nor namespace declarations; dropping them
    # leaves the page without a single URL (nothing that even looks like something to load).
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    return re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text, count=2)


def _figure(ncols: int = 1, width: float = 6.4, height: float = 3.4):
    plt = _pyplot()
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def _from_zero(ax, *, top_pad: float = 1.08) -> None:
    """A linear y axis that starts at zero: a 0.02% change must look like one, not like a jump."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(0.0, max(hi, 1e-12) * (top_pad if hi > 0 else 1.0))
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(nbins=6))


def around(values: Sequence[float]) -> tuple[float, float]:
    """A y range that shows how ``values`` differ: their span with a margin, never from zero
    (a tuning curve from 2.80 to 2.95 ms is flat on an axis from 0). Pure."""
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.08, abs(hi) * 0.005, 1e-12)
    return lo - pad, hi + pad


def ridge_point(copy_gbps: float | None, peak_tflops: float | None) -> float | None:
    """Arithmetic intensity (FLOP/B) where the bandwidth roof meets the compute roof:
    peak FLOP/s / bytes/s = (TFLOP/s x 1e12) / (GB/s x 1e9)."""
    if not copy_gbps or not peak_tflops or copy_gbps <= 0 or peak_tflops <= 0:
        return None
    return peak_tflops * 1e12 / (copy_gbps * 1e9)


def progress_chart(by_round: Series, by_gpu: Series, ylabel: str) -> str | None:
    """Best-so-far over rounds (left) and over GPU seconds (right), every evaluation as a dot."""
    if not by_round.points and not by_gpu.points:
        return None
    plt = _pyplot()
    with plt.rc_context(_STYLE):
        fig, (ax1, ax2) = _figure(2, width=10.0, height=3.4)
        if by_round.points:
            xs = [p.x for p in by_round.points]
            ys = [p.y for p in by_round.points]
            ax1.step(xs, ys, where="post", color="#1f77b4", marker="o")
            ax1.set_xticks(xs)
        ax1.set_xlabel("round")
        ax1.set_ylabel(ylabel)
        ax1.set_title("best so far, per round")
        _from_zero(ax1)
        ok = [p for p in by_gpu.points if p.ok]
        if ok:
            best, ys = None, []
            for p in ok:
                best = p.y if best is None else _better(best, p.y, ylabel)
                ys.append(best)
            ax2.scatter([p.x for p in ok], [p.y for p in ok], s=10, color="#999999", label="each correct kernel")
            ax2.step([p.x for p in ok], ys, where="post", color="#d62728", label="best so far")
            ax2.legend(loc="best", fontsize=8)
        ax2.set_xlabel("GPU seconds (evaluations and tuning)")
        ax2.set_ylabel(ylabel)
        ax2.set_title("best so far, over GPU time")
        _from_zero(ax2)
        return to_svg(fig)


def _better(a: float, b: float, ylabel: str) -> float:
    # a speedup is better when larger, a time when smaller
    return max(a, b) if "speedup" in ylabel else min(a, b)


def tuning_chart(curves: Sequence[Series]) -> str | None:
    """One line per tuned survivor: ms of each configuration in the order the tuner tried them,
    and its best so far dashed."""
    curves = [c for c in curves if any(p.ok for p in c.points)]
    if not curves:
        return None
    plt = _pyplot()
    with plt.rc_context(_STYLE):
        fig, (ax,) = _figure(1, width=8.0, height=3.4)
        for c in curves:
            ok = [p for p in c.points if p.ok]
            line = ax.plot([p.x for p in ok], [p.y for p in ok], marker="o", markersize=3, label=c.name)[0]
            best, ys = None, []
            for p in ok:
                best = p.y if best is None else min(best, p.y)
                ys.append(best)
            ax.step([p.x for p in ok], ys, where="post", linestyle="--", color=line.get_color(), alpha=0.6)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("configuration tried (in order)")
        ax.set_ylabel("median ms")
        ax.set_title("autotuning of each survivor (dashed: best so far; the axis spans the times, not from 0)")
        ax.set_ylim(*around([p.y for c in curves for p in c.points if p.ok]))
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="node")
        return to_svg(fig)


def roofline_chart(data: RooflineData) -> str | None:
    if not data.kernels and not data.references:
        return None
    if data.flops and data.flops > 0 and data.min_bytes > 0:
        return _roofline(data)
    return _bandwidth(data)


def _roofline(data: RooflineData) -> str:
    """Arithmetic intensity (FLOP/byte) vs achieved GFLOP/s under the measured ceilings."""
    plt = _pyplot()
    ai = data.flops / data.min_bytes  # type: ignore[operator]
    gflops = lambda ms: data.flops / (ms * 1e-3) / 1e9  # noqa: E731
    with plt.rc_context(_STYLE):
        fig, (ax,) = _figure(1, width=7.0, height=4.0)
        ridge = ridge_point(data.copy_gbps, data.peak_tflops)
        # the roof is drawn through its ridge point (a corner between two samples would be drawn
        # at the next sample instead: near 68 FLOP/B for a ridge of 12)
        xs = sorted({ai * f for f in (1e-3, 1e-2, 1e-1, 1, 10, 100, 1e3)} | ({ridge} if ridge else set()))
        if ridge:
            lo, hi = min(xs), max(xs)
            xs = sorted({min(lo, ridge / 10), ridge, max(hi, ridge * 10)} | set(xs))
        for gbps, tflops, style, label in ((data.copy_gbps, data.peak_tflops, "-", f"roof: {data.roof_label}"),
                                           (data.measured_gbps, data.measured_tflops, "--",
                                            "measured ceilings (device copy, cuBLAS matmul)")):
            if not (gbps or tflops):
                continue
            ceil = [min(gbps * x if gbps else float("inf"), tflops * 1e3 if tflops else float("inf")) for x in xs]
            ax.plot(xs, ceil, color="black", linestyle=style, label=label)
        if data.copy_gbps or data.peak_tflops:
            if ridge:
                ax.axvline(ridge, color="black", linestyle=":", linewidth=0.8,
                           label=f"ridge point {ridge:.1f} FLOP/B")
        ax.scatter([ai] * len(data.kernels), [gflops(p.y) for p in data.kernels], s=14, color="#1f77b4",
                   alpha=0.7, label="correct kernels")
        for i, p in enumerate(data.references):
            ax.scatter([ai], [gflops(p.y)], marker="s", s=30, color=("#ff7f0e", "#2ca02c")[i % 2], label=p.label)
        ax.axvline(ai, color="#bbbbbb", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP per byte of the minimum traffic)")
        ax.set_ylabel("achieved GFLOP/s")
        ax.set_title("roofline")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        return to_svg(fig)


def _bandwidth(data: RooflineData) -> str:
    """No FLOP count: achieved GB/s (minimum bytes / time) of each kernel vs the copy bandwidth."""
    plt = _pyplot()
    gbps = lambda ms: data.min_bytes / (ms * 1e-3) / 1e9  # noqa: E731
    with plt.rc_context(_STYLE):
        fig, (ax,) = _figure(1, width=8.0, height=3.6)
        order = sorted(data.kernels, key=lambda p: p.y)
        xs = list(range(len(order)))
        ax.bar(xs, [gbps(p.y) for p in order], color="#1f77b4", label="correct kernels (fastest first)")
        ax.set_xticks(xs, [p.label for p in order], rotation=90, fontsize=7)
        colors = ("#ff7f0e", "#2ca02c")
        for i, p in enumerate(data.references):
            ax.axhline(gbps(p.y), color=colors[i % 2], linestyle="--", label=p.label)
        if data.copy_gbps:
            ax.axhline(data.copy_gbps, color="black", label=f"roof: {data.roof_label}")
        if data.measured_gbps:
            ax.axhline(data.measured_gbps, color="black", linestyle="--", label="measured device copy bandwidth")
        ax.set_ylabel("achieved GB/s (minimum bytes / time)")
        _from_zero(ax)
        ax.set_xlabel("node")
        ax.set_title("bandwidth achieved (no FLOP count for this problem)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        return to_svg(fig)
