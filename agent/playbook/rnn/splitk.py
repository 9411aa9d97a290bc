"""The split-K recurrence's launch geometry (``lstm_splitk.cu.j2`` says what each name means): its tunables, the
sizes derived from them as expressions (the template's defines, the grid, the shared memory), the constraints that
refuse what does not fit, and a default picked by evaluating those same constraints.

The default: among the configurations admissible with KW = 8 warps and NG = 2 copy groups (else any), the one whose
block does the least work a step (``JB * BB`` padded outputs; the grid is at most COOP_NB blocks, so fewer outputs a
block is more of the GPU busy), then the larger JB (fewer blocks share a batch row, so fewer copies of h cross L2 a
step), then the fewer shared-memory wavefronts per FMA (a warp's float4 loads touch UGN distinct W rows and BGN
distinct h rows: one wavefront per 8).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from kerngen import expr

from kerngen.agent.playbook.render import COOP_NB, MAX_SMEM

__all__ = ["SK_TUNABLES", "SplitK", "splitk_exprs"]

# JB units a block, UJ units a lane, BR batch rows a lane, KW warps (K slices), NG cp.async groups a slice
SK_TUNABLES = {"JB": [2, 4, 8, 16, 32], "UJ": [1, 2, 4], "BR": [1, 2, 4, 8], "KW": [2, 4, 8, 16], "NG": [1, 2, 4]}
# accumulators + one step's W and h float4s a lane, at most: 96 at 512 threads (128 registers a thread), 160 below
# (255); both compile without spills (tests/agent/test_fam_lstm_splitk.py)
REGS, REGS_512 = 160, 96


@dataclass(frozen=True)
class SplitK:
    defines: dict[str, str]
    grid: list[str]
    smem: str
    constraints: list[str]

    def default(self) -> dict[str, int]:
        for fixed in ({"KW": 8, "NG": 2}, {}):
            keys = [k for k in SK_TUNABLES if k not in fixed]
            best: tuple | None = None
            for values in itertools.product(*(SK_TUNABLES[k] for k in keys)):
                cfg = {**fixed, **dict(zip(keys, values))}
                if not all(expr.evaluate_bool(c, cfg) for c in self.constraints):
                    continue
                bb = expr.evaluate_int(self.defines["BB"], cfg)
                uj, br, ugn = cfg["UJ"], cfg["BR"], cfg["JB"] // cfg["UJ"]
                waves = 4 * uj * -(-ugn // 8) + br * -(-(32 // ugn) // 8)  # shared-memory wavefronts a float4 of k
                key = (cfg["JB"] * bb, -cfg["JB"], waves / (uj * br), uj, cfg["KW"], cfg["NG"])
                if best is None or key < best[0]:
                    best = (key, cfg)
            if best is not None:
                return best[1]
        raise ValueError("the split-K recurrence admits no configuration")  # not reached: JB=2, UJ=2, BR=1 fits


def splitk_exprs(batch: int, hidden: int) -> SplitK:
    """The split-K recurrence's geometry at batch ``batch`` and hidden size ``hidden``."""
    B, H = batch, hidden
    ugn = "max(1, JB // UJ)"  # lanes across units
    bgn = f"(32 // {ugn})"  # lanes across batch rows
    bb = f"(BR * {bgn})"  # batch rows a block
    hk = f"(cdiv({H}, 4 * KW * NG) * 4 * KW * NG)"  # H padded to whole float4s of every group of every slice
    wp = f"({hk} + 4)"  # an odd multiple of 4 (HK is a multiple of 8)
    jbp = f"(JB + (1 - UJ % 2) * {ugn})"  # UGN times an odd number
    defines = {"UGN": ugn, "BGN": bgn, "BB": bb, "HK": hk, "KS": f"({hk} // KW)", "KG": f"({hk} // (KW * NG))",
               "WP": wp, "JBP": jbp, "NT": "(32 * KW)", "PP": f"cdiv(JB * {bb}, 32 * KW)"}
    smem = f"(4 * JB * {wp} + max({bb} * {wp}, KW * 4 * {bb} * {jbp})) * 4"
    constraints = [
        "JB % UJ == 0", f"{ugn} <= 32", f"32 % {ugn} == 0",
        f"(UJ - 1) * {ugn} < {H}", f"(BR - 1) * {bgn} < {B}",  # a lane's last unit / row is not all padding
        f"4 * UJ * BR + 16 * UJ + 4 * BR <= ({REGS_512} if KW >= 16 else {REGS})",
        f"cdiv({H}, JB) * cdiv({B}, {bb}) <= {COOP_NB}",  # resident at once: one block an SM
        f"{smem} <= {MAX_SMEM - 1024}",
    ]
    return SplitK(defines, [f"cdiv({H}, JB)", f"cdiv({B}, {bb})"], smem, constraints)
