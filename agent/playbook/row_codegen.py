"""A :class:`~.row_program.RowProgram` as straight-line CUDA-C: the body of the row kernel
(``gemm_rows_tail.cu.j2``) for one row ``r`` of the GEMM's output, ``BLOCK`` threads.

Vectors are evaluated lazily at a column ``j``: an elementwise node, a softmax's or a norm's output, a pool
window are C statements wherever a loop over the columns needs them (a pool's window re-declares ``j``
inside its own block). What needs the whole row runs at the node's place in the program: a reduction (a
loop, then a block reduction with warp shuffles, fp32 accumulation; logsumexp and softmax as an online
(max, sum of exp) pair), a norm's statistics (two passes per group, a team of warps per group, into shared
memory). With ``staged``, a vector evaluated more than once (the GEMM's row under a norm, the input of a
softmax, ...) is evaluated once into shared memory at its place; without, every pass recomputes it from the
GEMM's output in global memory (L1/L2), which fits any row length.
"""

from __future__ import annotations

from dataclasses import dataclass

from kerngen.agent.playbook.chain_ir import Chain, Node
from kerngen.agent.playbook.row_program import PoolKind, Reduction, RowNode, RowOp, RowProgram, TensorRef

__all__ = ["RowKernel", "compile_rows"]

_INIT = {Reduction.sum: "0.f", Reduction.mean: "0.f", Reduction.max: "RT_NEG_INF", Reduction.min: "RT_POS_INF"}
_BLOCK = {Reduction.sum: "rt_block_sum", Reduction.mean: "rt_block_sum", Reduction.max: "rt_block_max",
          Reduction.min: "rt_block_min"}
_FOLD = {Reduction.max: "{a} = kg_fmax({a}, {x});", Reduction.min: "{a} = kg_fmin({a}, {x});"}


@dataclass(frozen=True)
class RowKernel:
    body: tuple[str, ...]  # C lines of one row
    tensors: tuple[str, ...]  # the bound tensors read after the GEMM's output, in parameter order
    defines: dict[str, str]  # RT_* -> an expression over the bound tensors' shapes
    smem: str  # dynamic shared memory in bytes (an expression)
    staged: tuple[str, ...]  # the vectors held in shared memory


def _passes(prog: RowProgram, staged: bool) -> set[str]:
    """The vectors to hold in shared memory: those evaluated more than once (each pass over the row, and each
    window a pool reads it in, counts), when ``staged``."""
    passes = {n.var: 0 for n in prog.nodes}
    result = prog.node(prog.result)
    if result.vector:
        passes[result.var] = 1
    held: set[str] = set()
    for n in reversed(prog.nodes):
        p = passes[n.var]
        if staged and n.vector and n.dtype == "float" and p >= 2:
            held.add(n.var)
            p = 1
        extra = {RowOp.reduce: 1, RowOp.softmax: 1 + p, RowOp.log_softmax: 1 + p, RowOp.norm: 2 + p}.get(n.op, p)
        if n.op == RowOp.pool:
            extra = p * -(-n.pool.kernel // n.pool.stride)
        for a in {a for a in n.args if isinstance(a, str) and a in passes}:
            passes[a] += extra
    return held


class _Gen:
    def __init__(self, prog: RowProgram, staged: bool) -> None:
        self.prog = prog
        self.nodes = {n.var: n for n in prog.nodes}
        self.held = _passes(prog, staged)
        self.buffers: dict[str, str] = {}
        self.defines: dict[str, str] = {"RT_M": "", "RT_ORS": prog.out.row_stride or "0"}
        self.lengths: dict[str, str] = {}
        self.smem_terms: list[str] = []  # shared floats: C defines
        self.smem_exprs: list[str] = []  # the same, plan expressions
        self.lines: list[str] = []
        if prog.out.col_stride is not None:
            self.defines["RT_OCS"] = prog.out.col_stride
        for i, t in enumerate(prog.tensors):
            if t.row_stride is not None:
                self.defines[f"RT_RS{i}"] = t.row_stride
            if t.col_stride is not None:
                self.defines[f"RT_CS{i}"] = t.col_stride

    # -- names --------------------------------------------------------------------------------
    def length(self, n: RowNode) -> str:
        expr = n.length.expr
        if expr not in self.lengths:
            self.lengths[expr] = name = f"RT_L{len(self.lengths)}"
            self.defines[name] = expr
        return self.lengths[expr]

    def shared(self, floats_c: str, floats_expr: str) -> str:
        """A region of ``floats`` shared floats: its C address."""
        at = " + ".join(self.smem_terms) or "0"
        self.smem_terms.append(f"({floats_c})")
        self.smem_exprs.append(f"({floats_expr})")
        return f"(rt_smem + {at})"

    @staticmethod
    def tensor(i: int, t: TensorRef, col: bool) -> str:
        idx = []
        if t.row_stride is not None:
            idx.append(f"r * RT_RS{i}")
        if t.col_stride is not None and col:
            idx.append("j" if t.col_stride == "1" else f"(long long)j * RT_CS{i}")
        return f"rt_e{i}[{' + '.join(idx) or '0'}]"

    def operand(self, a: object, scope: dict[str, str], out: list[str]) -> object:
        if not isinstance(a, str):
            return a
        if a.startswith("e"):
            return self.tensor(int(a[1:]), self.prog.tensors[int(a[1:])], True)
        return self.at(a, scope, out)

    def ew_c(self, n: RowNode, args: tuple) -> str:
        ctx = tuple(Node(a, "gt", (0.0, 0.0), (), "bool") for a in n.args if isinstance(a, str)
                    and a in self.nodes and self.nodes[a].dtype == "bool")
        return Chain(ctx + (Node(n.var, n.ew, args, n.params, n.dtype),), n.var).statements()[-1]

    # -- a vector at column j -----------------------------------------------------------------
    def at(self, var: str, scope: dict[str, str], out: list[str]) -> str:
        """The C value of ``var`` at column ``j`` (statements appended to ``out``); a scalar is its name."""
        n = self.nodes[var]
        if not n.vector:
            return var
        if var in self.buffers:
            return f"{self.buffers[var]}[j]"
        if var in scope:
            return scope[var]
        if n.op == RowOp.source:
            out.append(f"const float {var} = __ldg(rt_src + j);")
        elif n.op == RowOp.ew:
            out.append(self.ew_c(n, tuple(self.operand(a, scope, out) for a in n.args)))
        elif n.op == RowOp.softmax:
            out.append(f"const float {var} = expf({self.at(n.args[0], scope, out)} - {var}_m) / {var}_s;")
        elif n.op == RowOp.log_softmax:
            out.append(f"const float {var} = ({self.at(n.args[0], scope, out)} - {var}_m) - {var}_l;")
        elif n.op == RowOp.norm:
            x = self.at(n.args[0], scope, out)
            w, b = (self.operand(a, scope, out) for a in n.args[1:])
            lit = lambda v: v if isinstance(v, str) else f"{float(v):.1f}f"  # noqa: E731  (1.0 / 0.0)
            g = f"(j / ({self.length(n)} / {n.groups}))"
            out.append(f"const float {var} = ({x} - {var}_gm[{g}]) * {var}_gr[{g}] * {lit(w)} + {lit(b)};")
        else:
            self.pool_at(n, out)
        scope[var] = var
        return var

    def pool_at(self, n: RowNode, out: list[str]) -> None:
        p, src = n.pool, self.nodes[str(n.args[0])]
        v = n.var
        inner: list[str] = []
        x = self.at(src.var, {}, inner)
        fold = f"{v}_a = kg_fmax({v}_a, {x});" if p.kind == PoolKind.max else f"{v}_a += {x}; ++{v}_c;"
        guard = f"{v}_i >= 0 && {v}_i < {self.length(src)}" if p.padding else "true"
        div = p.kernel if p.kind == PoolKind.avg and (p.count_include_pad or not p.padding) else f"{v}_c"
        out += [f"float {v}_a = {'RT_NEG_INF' if p.kind == PoolKind.max else '0.f'};", f"int {v}_c = 0;",
                f"for (int {v}_w = 0; {v}_w < {p.kernel}; ++{v}_w) {{",
                f"  const int {v}_i = j * {p.stride} - {p.padding} + {v}_w;",
                f"  if ({guard}) {{", f"    const int j = {v}_i;  // the window's column (shadows the output's)",
                *(f"    {s}" for s in inner), f"    {fold}", "  }", "}", f"(void){v}_c;"]
        res = f"{v}_a" if p.kind == PoolKind.max else f"{v}_a / (float)({div})"
        out.append(f"const float {v} = {res};")

    def loop(self, n: RowNode, body: list[str], tail: tuple[str, ...] = ()) -> None:
        """One C block: the block's threads over the columns of ``n`` (``j``) running ``body``, then ``tail``."""
        self.lines += ["{", f"  for (int j = threadIdx.x; j < {self.length(n)}; j += BLOCK) {{",
                       *(f"    {s}" for s in body), "  }", *(f"  {s}" for s in tail), "}"]

    # -- the program --------------------------------------------------------------------------
    def node(self, n: RowNode) -> None:
        v = n.var
        if n.op == RowOp.ew and not n.vector:
            self.lines.append(self.ew_c(n, tuple(
                self.tensor(int(a[1:]), self.prog.tensors[int(a[1:])], False) if isinstance(a, str)
                and a.startswith("e") else a for a in n.args)))
        elif n.op == RowOp.reduce:
            self.reduce(n)
        elif n.op in (RowOp.softmax, RowOp.log_softmax):
            src = self.nodes[str(n.args[0])]
            body: list[str] = []
            x = self.at(src.var, {}, body)
            self.lines += [f"float {v}_m = RT_NEG_INF, {v}_s = 0.f;"]
            self.loop(src, body + [f"rt_ms_fold({v}_m, {v}_s, {x});"], (f"rt_block_ms({v}_m, {v}_s, rt_red);",))
            if n.op == RowOp.log_softmax:
                self.lines.append(f"const float {v}_l = logf({v}_s);")
        elif n.op == RowOp.norm:
            self.norm(n)
        if v in self.held:
            body = []
            x = self.at(v, {}, body)
            self.buffers[v] = buf = f"rt_b{len(self.buffers)}"
            self.lines.insert(0, f"float *{buf} = {self.shared(self.length(n), n.length.expr)};")
            self.loop(n, body + [f"{buf}[j] = {x};"])
            self.lines.append("__syncthreads();  // the row's values are read across threads")

    def reduce(self, n: RowNode) -> None:
        v, src = n.var, self.nodes[str(n.args[0])]
        body: list[str] = []
        x = self.at(src.var, {}, body)
        red = n.reduction
        if red == Reduction.logsumexp:
            self.lines.append(f"float {v}_m = RT_NEG_INF, {v}_s = 0.f;")
            self.loop(src, body + [f"rt_ms_fold({v}_m, {v}_s, {x});"], (f"rt_block_ms({v}_m, {v}_s, rt_red);",))
            # torch.logsumexp: an infinite max is the result (no inf - inf)
            self.lines.append(f"const float {v} = fabsf({v}_m) == RT_POS_INF ? {v}_m : {v}_m + logf({v}_s);")
            return
        self.lines.append(f"float {v}_a = {_INIT[red]}, {v}_k = 0.f;")
        fold = _FOLD.get(red, f"RT_ADD({v}_a, {v}_k, {x});").format(a=f"{v}_a", x=x)
        self.loop(src, body + [fold], (f"{v}_a = {_BLOCK[red]}({v}_a - {v}_k, rt_red);",))
        mean = f" / (float)({self.length(src)})" if red == Reduction.mean else ""
        self.lines.append(f"const float {v} = {v}_a{mean};")

    def norm(self, n: RowNode) -> None:
        v, src, g = n.var, self.nodes[str(n.args[0])], n.groups
        gm = self.shared(str(g), str(g))
        gr = self.shared(str(g), str(g))
        self.lines.insert(0, f"float *{v}_gm = {gm}, *{v}_gr = {gr};")
        cols = f"({self.length(src)} / {g})"
        first: list[str] = []
        x1 = self.at(src.var, {}, first)
        second: list[str] = []
        x2 = self.at(src.var, {}, second)

        def walk(body: list[str]) -> list[str]:
            return [f"if (g < {g}) for (int c = tl; c < {cols}; c += WPT * 32) {{", f"  const int j = g * {cols} + c;",
                    *(f"  {s}" for s in body), "}"]
        self.lines += [
            "{  // statistics of each group: a team of WPT warps per group, two passes",
            f"  constexpr int TEAMS = rt_teams({g}), WPT = RT_NW / TEAMS;",
            "  const int team = (threadIdx.x >> 5) / WPT, tl = threadIdx.x % (WPT * 32);",
            f"  for (int g0 = 0; g0 < {g}; g0 += TEAMS) {{",
            "    const int g = g0 + team;",
            "    float a = 0.f, k = 0.f;",
            *(f"    {s}" for s in walk(first + [f"RT_ADD(a, k, {x1});"])),
            f"    const float mean = rt_team_sum<WPT>(a - k, rt_red) / (float){cols};",
            "    float q = 0.f, kq = 0.f;",
            *(f"    {s}" for s in walk(second + [f"const float d = {x2} - mean;", "RT_ADD(q, kq, d * d);"])),
            f"    const float var = rt_team_sum<WPT>(q - kq, rt_red) / (float){cols};",
            f"    if (g < {g} && tl == 0) {{ {v}_gm[g] = mean; {v}_gr[g] = rsqrtf(var + {n.params[0]!r}f); }}",
            "  }",
            "  __syncthreads();  // every group's statistics before any column reads them",
            "}"]

    def store(self) -> None:
        res = self.nodes[self.prog.result]
        if res.vector:
            body: list[str] = []
            x = self.at(res.var, {}, body)
            self.loop(res, body + [f"out[r * RT_ORS + (long long)j * RT_OCS] = {x};"])
        else:
            self.lines.append(f"if (threadIdx.x == 0) out[r * RT_ORS] = {res.var};")


def compile_rows(prog: RowProgram, rows: str, staged: bool) -> RowKernel:
    """The row kernel's body for ``prog``; ``rows``: the number of rows (an expression)."""
    g = _Gen(prog, staged)
    g.defines["RT_M"] = rows
    g.length(prog.source)  # RT_L0: the GEMM's row, the scratch buffer's row stride
    for n in prog.nodes:
        g.node(n)
    g.store()
    smem = f"4 * ({' + '.join(g.smem_exprs)})" if g.smem_exprs else "0"
    return RowKernel(tuple(g.lines), tuple(t.name for t in prog.tensors), g.defines, smem,
                     tuple(sorted(g.held, key=lambda v: int(v[1:]))))
