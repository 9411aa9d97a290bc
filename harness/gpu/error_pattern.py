"""Where the wrong elements of an output are, and how wrong: one short line for the repair prompt.

:func:`describe` reads an output and its reference chunk by chunk (like :mod:`.compare`: either may
live in host memory, each chunk is compared on ``device``) and keeps only bounded accumulators: a
few runs of wrong rows and elements, per-column counts (up to :data:`COL_CAP` columns), counts per
index residue mod :data:`STRIDE_BASE`, least-squares sums, and a bounded sample of relative
errors. The shape is read as rows x columns: the last dimension is the columns, the others the
rows. Clauses (joined by "; ", at most :data:`MAX_CHARS` characters) say NaN/Inf where the
reference is finite, elements never written (still poison), where the written wrong ones are, and
how wrong they are (a constant factor or offset, a factor per row, a shift by one, or the median
relative error). Examples, from tests/harness/test_error_pattern.py::

    wrong in 32 of 256 rows: 224..255 (the last 32), all 512 columns of each; wrong values = reference + 1 (...)
    in every row only columns 449..511 (the last 63) are wrong (a tail not handled?); wrong values are 0 (...)
    4096 of 131072 elements wrong, every 32nd element (index % 32 == 31: a vector width or lane stride?); ...
    all 262144 elements wrong; wrong values = reference x 1.031 (a constant factor: a scale or normalisation bug?)
    never written (still poison) in 65536 of 131072 elements: 65536..131071 (the last 65536); rows 128..255

It runs only for a comparison that failed, so a correct kernel pays nothing for it.
"""

from __future__ import annotations

import math

import torch

from kerngen.harness.gpu.buffers import Poison, still_poisoned

MAX_RUNS = 4  # runs of rows / elements kept in full (more are counted; the last one is kept too)
COL_CAP = 1 << 20  # per-column counts up to this many columns (8 MB)
ROW_FIT_CAP = 1 << 16  # per-row least-squares sums up to this many rows (2 MB)
STRIDE_BASE = 1024  # counts per index % 1024 tell "every 32nd element" (any power of two up to it)
SAMPLE = 1 << 16  # relative errors kept for the median, over the whole output
FEW = 3  # as many wrong elements as are named one by one
NEARLY = 0.95  # "all" of a row, column or output: a few elements near zero pass atol whatever the bug
EXPLAINED = 0.01  # a fit "explains" the error when what it leaves is under 1% of the error's energy
MAX_CHARS = 300  # two short lines of a prompt


class _Runs:
    """Runs ``[a, b)`` of set positions, fed in ascending order (a run may overlap the previous
    one by a position: a row split between two chunks); keeps the first :data:`MAX_RUNS`, the last,
    how many there are and how many positions they cover."""

    def __init__(self) -> None:
        self.first: list[tuple[int, int]] = []
        self.last: tuple[int, int] | None = None
        self.count = 0
        self.covered = 0

    def _push(self, a: int, b: int) -> None:
        if self.last is not None and a <= self.last[1]:
            merged = (self.last[0], max(b, self.last[1]))
            self.covered += merged[1] - self.last[1]
            if self.first and self.first[-1] == self.last:
                self.first[-1] = merged
            self.last = merged
            return
        self.count += 1
        self.covered += b - a
        self.last = (a, b)
        if len(self.first) < MAX_RUNS:
            self.first.append((a, b))

    def add_mask(self, lo: int, mask: torch.Tensor) -> None:
        """The set positions of a boolean vector whose element 0 is position ``lo``."""
        total = int(mask.sum())
        if total == 0:
            return
        zero = torch.zeros(1, dtype=torch.int8, device=mask.device)
        edges = torch.diff(mask.to(torch.int8), prepend=zero, append=zero)
        starts, ends = edges == 1, edges == -1
        n = int(starts.sum())
        heads = list(zip(_first_true(starts, MAX_RUNS), _first_true(ends, MAX_RUNS)))
        for a, b in heads:
            self._push(lo + a, lo + b)
        if n > len(heads):
            a = starts.numel() - 1 - int(torch.argmax(starts.flip(0).to(torch.uint8)))
            b = ends.numel() - 1 - int(torch.argmax(ends.flip(0).to(torch.uint8)))
            middle = n - len(heads) - 1
            self.count += middle
            self.covered += total - sum(y - x for x, y in heads) - (b - a)
            self._push(lo + a, lo + b)

    def runs(self) -> list[tuple[int, int]]:
        return self.first + ([self.last] if self.last is not None and self.last not in self.first else [])


def _first_true(mask: torch.Tensor, k: int) -> list[int]:
    """Indices of the first ``k`` set elements, reading windows that grow (a bounded nonzero)."""
    out: list[int] = []
    start, width = 0, 1 << 16
    while start < mask.numel() and len(out) < k:
        idx = torch.nonzero(mask[start : start + width]).flatten()[: k - len(out)]
        out.extend(int(i) + start for i in idx.tolist())
        start, width = start + width, width * 4
    return out


def _row_split(lo: int, n: int, cols: int) -> tuple[int, int, int]:
    """A chunk ``[lo, lo + n)`` as (head, middle, tail) lengths: the end of a row begun in an
    earlier chunk, whole rows, the start of a row that goes on."""
    head = min(n, (-lo) % cols)
    middle = (n - head) // cols * cols
    return head, middle, n - head - middle


def _row_sums(x: torch.Tensor, lo: int, cols: int) -> tuple[int, torch.Tensor]:
    """(first row, per-row sums) of a chunk vector whose element 0 is flat index ``lo``."""
    head, middle, tail = _row_split(lo, x.numel(), cols)
    parts = []
    if head:
        parts.append(x[:head].sum(0, keepdim=True))
    if middle:
        parts.append(x[head : head + middle].reshape(-1, cols).sum(1))
    if tail:
        parts.append(x[head + middle :].sum(0, keepdim=True))
    return lo // cols, torch.cat(parts)


def _col_sums(x: torch.Tensor, lo: int, cols: int) -> torch.Tensor:
    """Per-column (index % cols) sums of a chunk vector whose element 0 is flat index ``lo``."""
    head, middle, tail = _row_split(lo, x.numel(), cols)
    out = torch.zeros(cols, dtype=torch.int64 if x.dtype == torch.bool else x.dtype, device=x.device)
    c0 = lo % cols
    if head:
        out[c0 : c0 + head] += x[:head]
    if middle:
        out += x[head : head + middle].reshape(-1, cols).sum(0)
    if tail:
        out[:tail] += x[head + middle :]
    return out


class PatternAccumulator:
    """What :func:`describe` keeps while it reads the chunks of one output."""

    def __init__(self, shape: tuple[int, ...], atol: float, rtol: float, name: str = "out") -> None:
        self.shape, self.name, self.atol, self.rtol = shape, name, atol, rtol
        self.numel = math.prod(shape)
        self.cols = shape[-1] if len(shape) >= 1 and shape[-1] > 0 else 1
        self.rows = self.numel // self.cols if self.cols else 0
        self.wrong = 0  # written and wrong (poisoned elements are counted apart)
        self.poisoned = 0
        self.rows_wrong, self.flat_wrong, self.flat_poison = _Runs(), _Runs(), _Runs()
        self.col_counts: torch.Tensor | None = None
        self.residues: torch.Tensor | None = None
        # least squares over the written wrong elements finite in both: n, Σo, Σr, Σor, Σrr, Σoo, Σ(o-r)²
        self.sums = torch.zeros(7, dtype=torch.float64)
        self.row_fit: torch.Tensor | None = None  # [rows, 4]: Σor, Σrr, Σoo, Σ(o-r)² per row
        self.nonfinite = {"NaN": 0, "Inf": 0, "finite": 0}
        self.first_nonfinite: dict[str, int] = {}
        # per shift: [out[i] = ref[i-d], wrong elements tried, out[i] = ref[i+d], tried]
        self.shift_hits = {"element": [0, 0, 0, 0], "row": [0, 0, 0, 0]}
        self.samples: list[torch.Tensor] = []
        self._sampled = 0

    # ----- reading ----------------------------------------------------------------------------
    def add(self, lo: int, out: torch.Tensor, ref: torch.Tensor, poison: Poison | None = None,
            exact: bool = False) -> None:
        """One chunk: flat elements ``[lo, lo + len)`` of the output, its reference and poison."""
        o, r = out.double(), ref.double()
        wrong = (out != ref) if exact else ~torch.isclose(o, r, rtol=self.rtol, atol=self.atol, equal_nan=True)
        written: torch.Tensor | None = None
        if poison is not None:
            # still the poison's bits and not the reference's: never written, even where a random
            # poison value happens to fall within atol of the reference
            same = (out == ref) | (torch.isnan(o) & torch.isnan(r))
            unwritten = still_poisoned(out, poison, lo) & ~same
            self.poisoned += int(unwritten.sum())
            self.flat_poison.add_mask(lo, unwritten)
            wrong &= ~unwritten
            written = ~unwritten
        if not bool(wrong.any()):
            return
        nw = int(wrong.sum())
        if nw == 0:
            return
        self.wrong += nw
        self.flat_wrong.add_mask(lo, wrong)
        first_row, per_row = _row_sums(wrong, lo, self.cols)
        self.rows_wrong.add_mask(first_row, per_row > 0)
        if 1 < self.cols <= COL_CAP and self.rows > 1:
            counts = _col_sums(wrong, lo, self.cols).cpu()
            self.col_counts = counts if self.col_counts is None else self.col_counts + counts
        res = _col_sums(wrong, lo, STRIDE_BASE).cpu()
        self.residues = res if self.residues is None else self.residues + res
        self._nonfinite(lo, o, r, wrong)
        finite = wrong & torch.isfinite(o) & torch.isfinite(r)
        fo, fr = torch.where(finite, o, 0.0), torch.where(finite, r, 0.0)
        d = fo - fr
        self.sums += torch.stack([finite.sum().double(), fo.sum(), fr.sum(), (fo * fr).sum(), (fr * fr).sum(),
                                  (fo * fo).sum(), (d * d).sum()]).cpu()
        if 1 < self.cols and 1 < self.rows <= ROW_FIT_CAP:
            self._row_fit(lo, o, r, written)
        self._shifts(o, r, wrong, exact)
        self._sample(d, fr, finite)

    def _nonfinite(self, lo: int, o: torch.Tensor, r: torch.Tensor, wrong: torch.Tensor) -> None:
        r_fin = torch.isfinite(r)
        for kind, mask in (("NaN", torch.isnan(o) & r_fin), ("Inf", torch.isinf(o) & r_fin),
                           ("finite", torch.isfinite(o) & ~r_fin)):
            mask &= wrong
            n = int(mask.sum())
            if n:
                self.nonfinite[kind] += n
                self.first_nonfinite.setdefault(kind, lo + int(torch.argmax(mask.to(torch.uint8))))

    def _row_fit(self, lo: int, o: torch.Tensor, r: torch.Tensor, written: torch.Tensor | None) -> None:
        """Per-row sums over every finite written element (a row scaled by its own factor may have
        elements near zero that pass atol: the fit needs the whole row). One product at a time:
        each is a chunk-sized temporary."""
        valid = torch.isfinite(o) & torch.isfinite(r)
        if written is not None:
            valid &= written
        fo, fr = torch.where(valid, o, 0.0), torch.where(valid, r, 0.0)
        if self.row_fit is None:
            self.row_fit = torch.zeros(self.rows, 4, dtype=torch.float64)
        for k, product in enumerate((lambda: fo * fr, lambda: fr * fr, lambda: fo * fo, lambda: (fo - fr) ** 2)):
            first, sums = _row_sums(product(), lo, self.cols)
            self.row_fit[first : first + sums.shape[0], k] += sums.cpu()

    def _shifts(self, o: torch.Tensor, r: torch.Tensor, wrong: torch.Tensor, exact: bool) -> None:
        """How many wrong elements hold the reference of the element (or row) before or after:
        an index off by one. Within the chunk only (a chunk edge loses a few)."""
        n = o.numel()
        for key, d in (("element", 1), ("row", self.cols)):
            if (key == "row" and (self.cols <= 1 or self.rows <= 1)) or d >= n:
                continue
            # out[i] = ref[i - d] on i in [d, n), then out[i] = ref[i + d] on i in [0, n - d)
            for k, (w, a, b) in enumerate(((wrong[d:], o[d:], r[:-d]), (wrong[:-d], o[:-d], r[d:]))):
                hit = (a == b) if exact else torch.isclose(a, b, rtol=self.rtol, atol=self.atol)
                self.shift_hits[key][2 * k] += int((hit & w).sum())
                self.shift_hits[key][2 * k + 1] += int(w.sum())

    def _sample(self, d: torch.Tensor, fr: torch.Tensor, finite: torch.Tensor) -> None:
        """A bounded sample of |out - ref| / |ref| over the wrong elements: all of them while they
        are few, else an evenly strided part of the chunk (which many wrong elements fill)."""
        if self._sampled >= SAMPLE:
            return
        keep = finite & (fr != 0)
        step = 1 if int(keep.sum()) <= SAMPLE else max(1, d.numel() // SAMPLE)
        keep = keep[::step]
        rel = (d[::step].abs() / fr[::step].abs())[keep][: SAMPLE - self._sampled]
        self._sampled += rel.numel()
        self.samples.append(rel.cpu())

    # ----- saying it --------------------------------------------------------------------------
    def text(self) -> str:
        parts = [self._nonfinite_text(), self._poison_text(), self._where_text(), self._how_text()]
        line = "; ".join(p for p in parts if p)
        return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 3] + "..."

    def _index(self, flat: int) -> str:
        idx = []
        for dim in reversed(self.shape):
            idx.append(flat % dim)
            flat //= dim
        return f"{self.name}[{', '.join(map(str, reversed(idx)))}]"

    def _nonfinite_text(self) -> str:
        said = []
        for kind, what in (("NaN", "NaN"), ("Inf", "Inf")):
            if self.nonfinite[kind]:
                said.append(f"{what} in {self.nonfinite[kind]} elements where the reference is finite "
                            f"(first at {self._index(self.first_nonfinite[kind])})")
        if self.nonfinite["finite"]:
            said.append(f"finite in {self.nonfinite['finite']} elements where the reference is NaN/Inf")
        return "; ".join(said)

    def _poison_text(self) -> str:
        if not self.poisoned:
            return ""
        where = _runs_text(self.flat_poison, self.numel)
        rows = ""
        runs = self.flat_poison.runs()
        if self.cols > 1 and self.flat_poison.count <= MAX_RUNS and all(a % self.cols == 0 == b % self.cols
                                                                          for a, b in runs):
            rows = "; rows " + ", ".join(f"{a // self.cols}..{b // self.cols - 1}" for a, b in runs)
        return f"never written (still poison) in {self.poisoned} of {self.numel} elements: {where}{rows}"

    def _where_text(self) -> str:
        w, n = self.wrong, self.numel
        if w == 0:
            return ""
        lead = "written but wrong: " if self.poisoned else ""
        if w == n:
            return f"{lead}all {n} elements wrong"
        if w >= NEARLY * n:  # a few elements near zero pass atol whatever the bug
            return f"{lead}nearly all elements wrong ({w} of {n})"
        count = f"{w} of {n} elements wrong"
        if w <= FEW:
            return f"{lead}{count}: " + ", ".join(self._index(i) for a, b in self.flat_wrong.runs() for i in range(a, b))
        two_d = self.rows > 1 and self.cols > 1
        kind, cols = self._cols() if two_d else ("", "")
        stride = "" if kind in ("all", "only") else self._stride()
        if not two_d:
            return f"{lead}{count}, {stride}" if stride else f"{lead}{count}: {_runs_text(self.flat_wrong, n)}"
        every_row = self.rows_wrong.covered == self.rows
        rows = ("in every row" if every_row else
                f"in {self.rows_wrong.covered} of {self.rows} rows: {_runs_text(self.rows_wrong, self.rows)}")
        if stride:  # a stride says more than a list of columns
            return f"{lead}{count}, {stride}" + ("" if every_row else f"; {rows}")
        if kind == "all":
            return f"{lead}wrong {rows}, all {self.cols} columns of each"
        if kind == "only" and every_row:
            tail = " (a tail not handled?)" if "(the last" in cols else " (a head skipped?)" if "(the first" in cols \
                else ""
            return f"{lead}in every row only columns {cols} are wrong{tail}"
        if kind == "only":
            return f"{lead}wrong {rows}, only columns {cols}"
        if kind == "some":
            return f"{lead}wrong {rows}; wrong columns: {cols}"
        if kind == "scattered":
            return f"{lead}{count} ({100 * w / n:.2g}%), scattered over {cols} columns, {rows}"
        return f"{lead}{count}, {rows}"

    def _cols(self) -> tuple[str, str]:
        """Which columns the wrong rows have wrong: ("all", ""), ("only", the one run, e.g. a tail),
        ("some", a few runs), ("scattered", how many), or ("", "") without per-column counts. A
        column counts as wrong in every wrong row when it is in 95% of them: an element near zero
        passes atol whatever the bug."""
        if self.col_counts is None:
            return "", ""
        n_rows = self.rows_wrong.covered
        touched = int((self.col_counts > 0).sum())
        full = self.col_counts >= NEARLY * n_rows
        if int(full.sum()) < NEARLY * touched:
            return "scattered", f"{touched} of {self.cols}"
        cols = _Runs()
        cols.add_mask(0, full)
        if cols.covered == self.cols:
            return "all", ""
        where = _runs_text(cols, self.cols)
        if cols.count == 1:
            return "only", where
        return "some", where

    def _stride(self) -> str:
        """'every 32nd element (index % 32 == 31)' when the wrong elements sit on a few residues of
        a power-of-two period P (at most 1 in 8 of them), each hit many times. P is where halving
        the modulus stops halving the residues hit: past the period they double."""
        if self.residues is None or self.flat_wrong.count < 4:
            return ""
        s = STRIDE_BASE
        hits = int((self.residues > 0).sum())
        while s > 1:
            half = int((self.residues.reshape(-1, s // 2).sum(0) > 0).sum())
            if 2 * half != hits:
                break
            s, hits = s // 2, half
        if s < 8 or hits > s // 8 or self.wrong < 4 * hits:
            return ""
        folded = self.residues.reshape(-1, s).sum(0)
        hit = torch.nonzero(folded).flatten().tolist()
        shown = " or ".join(str(h) for h in hit[:3]) + (" ..." if len(hit) > 3 else "")
        every = f"every {_nth(s)} element" if len(hit) == 1 else f"{len(hit)} in every {s} elements"
        return f"{every} (index % {s} == {shown}: a vector width or lane stride?)"

    def _how_text(self) -> str:
        n, so, sr, sor, srr, soo, err2 = self.sums.tolist()
        said = self._fit_text(n, so, sr, sor, srr, soo, err2) or self._row_fit_text() or self._shift_text()
        if said:
            return said
        rel = torch.cat(self.samples) if self.samples else torch.zeros(0)
        if not rel.numel():
            return ""
        median = float(rel.median())
        size = f"{100 * median:.2g}%" if median < 1 else f"{median:.3g}x"
        return f"wrong values off by {size} of |ref| (median)"

    def _fit_text(self, n: float, so: float, sr: float, sor: float, srr: float, soo: float, err2: float) -> str:
        if n < 2 or err2 <= 0:
            return ""
        if soo == 0:
            return "wrong values are 0 (never computed or stored?)"
        var_r = srr - sr * sr / n
        if var_r <= 1e-12 * srr:  # one reference value: a fit would divide by rounding noise
            return ""
        a = (sor - so * sr / n) / var_r
        b = (so - a * sr) / n
        # what o ≈ a r + b leaves: Σ(o - a r - b)² = Σ(o - mean o)² - a² var_r
        resid = max(soo - so * so / n - a * a * var_r, 0.0)
        if resid > EXPLAINED * err2:
            return ""
        scale = math.sqrt(srr / n)
        if abs(b) <= 1e-3 * scale:
            if abs(a) < 1e-6:
                return "wrong values are 0 (never computed or stored?)"
            if abs(a + 1) < 1e-3:
                return "wrong values = -reference (a sign error)"
            return f"wrong values = reference x {a:.4g} (a constant factor: a scale or normalisation bug?)"
        if abs(a - 1) < 1e-3:
            return f"wrong values = reference + {b:.4g} (a constant offset: a bias added twice or missing?)"
        if abs(a) < 1e-6:
            return f"wrong values are all {b:.4g}, whatever the reference (not computed from the input?)"
        return f"wrong values = {a:.4g} x reference + {b:.4g}"

    def _row_fit_text(self) -> str:
        if self.row_fit is None:
            return ""
        sor, srr, soo, err2 = self.row_fit.unbind(1)
        bad = (err2 > 0) & (srr > 0)
        if not bool(bad.any()):
            return ""
        factor = sor[bad] / srr[bad]
        resid = (soo[bad] - sor[bad] * factor).clamp(min=0)
        if float(resid.sum()) > EXPLAINED * float(err2[bad].sum()):
            return ""
        lo, hi = float(factor.min()), float(factor.max())
        return (f"each wrong row = the reference row x its own factor ({lo:.3g}..{hi:.3g}): "
                "a per-row normalisation (row sum or max) bug?")

    def _shift_text(self) -> str:
        for key, what in (("element", "one element"), ("row", "one row")):
            back, tried_back, ahead, tried_ahead = self.shift_hits[key]
            if (tried_back and back >= 0.9 * tried_back) or (tried_ahead and ahead >= 0.9 * tried_ahead):
                return f"the wrong values are the reference shifted by {what} (an index off by one?)"
        return ""


def _run(a: int, b: int, total: int) -> str:
    """``a..b-1`` of ``[a, b)``, saying where it sits when it starts or ends the range."""
    if b - a == 1:
        return f"{a}"
    text = f"{a}..{b - 1}"
    if b == total and a > 0:
        return f"{text} (the last {b - a})"
    if a == 0 and b < total:
        return f"{text} (the first {b})"
    return text


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _runs_text(runs: _Runs, total: int) -> str:
    shown = runs.runs()
    if runs.count == 1:
        return _run(*shown[0], total)
    period = _period(runs)
    if period:
        step, length = period
        return (f"every {_nth(step)} from {shown[0][0]}" if length == 1 else
                f"{length} in every {step} from {shown[0][0]} ({runs.count} runs)")
    listed = ", ".join(f"{a}..{b - 1}" if b - a > 1 else f"{a}" for a, b in runs.first)
    if runs.count > len(runs.first):
        a, b = shown[-1]
        last = f"{a}..{b - 1}" if b - a > 1 else f"{a}"
        listed += f", ... +{runs.count - len(runs.first)} more runs to {last}"
    return listed


def _period(runs: _Runs) -> tuple[int, int] | None:
    """(step, length) when the runs are evenly spaced and of one length (every other row, ...)."""
    if runs.count < MAX_RUNS or runs.last is None:
        return None
    starts = [a for a, _ in runs.first]
    lengths = {b - a for a, b in runs.runs()}
    steps = {y - x for x, y in zip(starts, starts[1:])}
    if len(lengths) != 1 or len(steps) != 1:
        return None
    step = steps.pop()
    if (runs.last[0] - starts[0]) != step * (runs.count - 1):
        return None
    return step, lengths.pop()


def describe(out: torch.Tensor, ref: torch.Tensor, *, atol: float, rtol: float, poison: Poison | None = None,
             exact: bool = False, name: str = "out", chunk: int = 1 << 25, device: torch.device | None = None) -> str:
    """The pattern of the elements of ``out`` that differ from ``ref`` (beyond ``atol``/``rtol``,
    or at all with ``exact``), read chunk by chunk on ``device`` (default: ``out``'s)."""
    if tuple(out.shape) != tuple(ref.shape) or out.numel() == 0:
        return ""
    dev = device if device is not None else out.device
    acc = PatternAccumulator(tuple(out.shape), atol, rtol, name)
    o_all, r_all = out.reshape(-1), ref.reshape(-1)
    step = max(1, chunk)
    for lo in range(0, out.numel(), step):
        hi = min(lo + step, out.numel())
        acc.add(lo, o_all[lo:hi].to(dev), r_all[lo:hi].to(dev), poison, exact=exact)
    return acc.text()


__all__ = ["PatternAccumulator", "describe"]
