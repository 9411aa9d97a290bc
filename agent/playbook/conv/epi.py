"""Playbook family ``conv_epi``: one 1-D or 2-D convolution (any stride, zero padding, dilation, groups) of a
forward input, followed by an elementwise epilogue (relu, mish, a per-channel bias or scale, a residual input,
an eval-mode batch norm, ...) traced by :mod:`.epilogue` and applied in registers before the store. A 1-D conv
is a 2-D one with H = 1. Also the conv families' shared reading of a convolution node (:func:`geometry`).

The more specific families ask first: a plain conv2d (``conv2d``), conv2d + relu + max-pool
(``conv_relu_maxpool``, for which this one returns None), a conv2d followed by reductions, pools or norms
(``conv_tail``). A conv followed by anything that is not elementwise is this family's to refuse, with the
tracer's reason.
"""

from __future__ import annotations

from typing import Any

from kerngen.agent.playbook.conv import build_epi as build
from kerngen.agent.playbook.conv.build_tf32 import CONV_EPI_IDEAS, conv_epi_tf32x3
from kerngen.agent.playbook.conv import build_s2d as s2d
from kerngen.agent.playbook.conv import build_wgmma as wgmma
from kerngen.agent.playbook.conv.tail_ir import Tail
from kerngen.agent.playbook.entry import A, C, CF, Entry, M, PAR
from kerngen.agent.playbook.epilogue import Epilogue, trace_epilogue
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph, Node, Tensor
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["CONV_EPI", "CONV_OPS", "ConvFacts", "check_dtypes", "conv_lead", "conv_input", "geometry", "read_conv_epi"]

NAME = "conv_epi"
# ATen conv op -> (spatial dims, transposed)
CONV_OPS = {"conv1d": (1, False), "conv2d": (2, False), "conv3d": (3, False), "conv_transpose1d": (1, True),
            "conv_transpose2d": (2, True), "conv_transpose3d": (3, True)}
_MODULES = {"conv1d": "Conv1d", "conv2d": "Conv2d", "conv3d": "Conv3d", "conv_transpose1d": "ConvTranspose1d",
            "conv_transpose2d": "ConvTranspose2d", "conv_transpose3d": "ConvTranspose3d"}


class ConvFacts(Facts):
    """A 1-D or 2-D convolution (a 1-D one as H = 1) and what follows it."""

    dims: int = 2
    C: int
    OC: int
    G: int = 1
    KH: int
    KW: int
    SH: int
    SW: int
    PH: int
    PW: int
    DH: int = 1
    DW: int = 1
    x: str = ""
    weight: str
    bias: str | None = None
    epilogue: Epilogue | None = None
    dtype: str = "float32"  # conv16: every tensor in this dtype
    formula: str = ""
    tail: Tail | None = None  # conv_tail: the stages after it
    PK: int = 0  # conv_relu_maxpool: the max-pool's window and stride
    PS: int = 0


def conv_lead(g: Graph, ops: tuple[str, ...] = tuple(CONV_OPS)) -> Node | None:
    """The one convolution of the graph among ``ops``; None when there is none or another convolution too."""
    convs = [n for n in g.live() if n.op in CONV_OPS]
    if len(convs) != 1 or convs[0].op not in ops:
        return None
    return convs[0]


def kind_of(n: Node) -> str:
    """The nn module type the conv op is (for messages): ``Conv2d``."""
    return _MODULES[n.op]


def _ints(v: Any, dims: int, what: str = "geometry") -> tuple[int, ...]:
    if isinstance(v, str):
        raise NotCovered(f"conv {what} {v!r} is not covered")
    t = tuple(int(e) for e in v) if isinstance(v, (tuple, list)) else (int(v),) * dims
    if len(t) == 1 and dims > 1:
        t = t * dims
    if len(t) != dims:
        raise NotCovered(f"cannot read a {dims}-D conv's {what} from {v!r}")
    return t


def geometry(g: Graph, n: Node) -> dict[str, Any]:
    """dims, transposed, C, OC, G and per-dim kernel, stride, padding, dilation, output padding of a conv node
    (tuples over its spatial dims)."""
    dims, transposed = CONV_OPS[n.op]
    w = g.tensor(n["weight"]) if n["weight"] is not None else None
    x_shape = g.shape(n["input"])
    if w is None or x_shape is None or len(x_shape) != dims + 2 or len(w.shape) != dims + 2:
        raise NotCovered(f"the {kind_of(n)}'s weight is not a parameter of the model, or its input is not "
                         f"{dims + 2}-D: not covered")
    groups = int(n["groups"])
    k = tuple(w.shape[2:])
    d = _ints(n["dilation"], dims, "dilation")
    pad = n["padding"]
    if pad == "valid":
        p: tuple[int, ...] = (0,) * dims
    elif pad == "same":  # torch pads d*(k-1) in all, the odd one on the right: symmetric only when even
        total = [dd * (kk - 1) for kk, dd in zip(k, d)]
        if any(t % 2 for t in total):
            raise NotCovered("padding='same' with an odd total padding (asymmetric) is not covered")
        p = tuple(t // 2 for t in total)
    else:
        p = _ints(pad, dims, "padding")
    oc = w.shape[1] * groups if transposed else w.shape[0]
    op = _ints(n["output_padding"], dims, "output_padding") if transposed else (0,) * dims
    return dict(dims=dims, transposed=transposed, C=int(x_shape[1]), OC=int(oc), G=groups, K=k,
                S=_ints(n["stride"], dims, "stride"), P=p, D=d, OP=op, padding_str=isinstance(pad, str))


def conv_input(g: Graph, n: Node, family: str = NAME) -> Tensor:
    """The graph input the conv reads, else NotCovered naming ``family``."""
    x = g.tensor(n["input"])
    if x is None or not g.is_input(x.name):
        raise NotCovered(f"the {kind_of(n)} is not applied directly to a forward input: not covered by {family}")
    return x


def check_dtypes(g: Graph, names: list[str], family: str = NAME, dtype: str = "float32") -> None:
    """``dtype`` inputs and parameters ``names`` (fp32 unless asked), else :class:`NotCovered` naming ``family``."""
    dtypes = set(g.dtypes) | {t.dtype for t in g.params if t.name in names}
    if dtypes != {dtype}:
        what = "fp32 only" if dtype == "float32" else f"in {dtype} only"
        raise NotCovered(f"{family} computes {what} ({', '.join(sorted(dtypes - {dtype}))} is not covered)")


def conv_facts(g: Graph, n: Node, family: str = NAME) -> ConvFacts:
    """The conv's geometry as a 2-D one (a 1-D conv as H = 1), its input, weight and bias."""
    geo = geometry(g, n)
    k, s, p, d = geo["K"], geo["S"], geo["P"], geo["D"]
    if geo["dims"] == 1:
        k, s, p, d = (1, *k), (1, *s), (0, *p), (1, *d)
    x = conv_input(g, n, family)
    return ConvFacts(dims=geo["dims"], C=geo["C"], OC=geo["OC"], G=geo["G"], KH=k[0], KW=k[1], SH=s[0], SW=s[1],
                     PH=p[0], PW=p[1], DH=d[0], DW=d[1], x=x.name, weight=n["weight"], bias=n["bias"])


def lead_shape(x: Tensor, f: ConvFacts) -> tuple[int, ...]:
    """The conv's output shape, as torch computes it."""
    hw = (1, x.shape[2]) if f.dims == 1 else x.shape[2:]
    oh = (hw[0] + 2 * f.PH - f.DH * (f.KH - 1) - 1) // f.SH + 1
    ow = (hw[1] + 2 * f.PW - f.DW * (f.KW - 1) - 1) // f.SW + 1
    if oh < 1 or ow < 1:
        raise NotCovered("the convolution's output is empty at this input size")
    return (x.shape[0], f.OC, ow) if f.dims == 1 else (x.shape[0], f.OC, oh, ow)


def relu_pool(g: Graph) -> bool:
    """conv2d + exactly one relu + one max-pool: the built-in conv_relu_maxpool family's shape."""
    ops = sorted(g.ops())
    return ops == ["conv2d", "max_pool2d", "relu"]


def _recognise(g: Graph) -> FamilyMatch | None:
    return read_conv_epi(g)


def read_conv_epi(g: Graph, dtype: str = "float32", family: str = NAME) -> FamilyMatch | None:
    """conv_epi's match of ``g`` with every tensor in ``dtype`` (conv16 reads its 16-bit problems so)."""
    n = conv_lead(g, ("conv1d", "conv2d"))
    if n is None or relu_pool(g):
        return None
    f = conv_facts(g, n)
    lead_shape(g.tensor(f.x), f)
    try:
        ep = trace_epilogue(g, n, channel_dim=1)
    except NotCovered as exc:
        raise NotCovered(f"{kind_of(n)} followed by what {family} cannot fuse as an elementwise epilogue: {exc}") from None
    if f.bias is not None and not g.is_param(f.bias):
        raise NotCovered(f"the conv's bias {f.bias!r} is not a parameter of the model: not covered by {family}")
    check_dtypes(g, [f.weight] + ([f.bias] if f.bias else []) + [p.name for p in ep.params], family, dtype)
    return FamilyMatch.of(g, f.model_copy(update=dict(epilogue=ep, formula=ep.formula or "none")))


# ---------------------------------------------------------------------------------------------
IDEAS: tuple[Entry, ...] = (
    Entry("cepi-igemm", "Implicit GEMM per group with the epilogue fused: C[M=N*OH*OW][OC/groups] = "
          "A[M][K=C/groups*KH*KW] x B[K][OC/groups]; the dilated im2col tile of x is gathered straight into "
          "shared memory with zero-filling 4-byte cp.async (padding never branches), weights packed once per "
          "call to [group][K][OC], a multi-stage cp.async pipeline, a TM x TN FFMA register tile, and the conv "
          "bias and the elementwise epilogue applied to the accumulators before the only store.", C,
          "FFMA-bound like a tuned SGEMM (the built-in conv2d igemm reached 1.72x eager); the epilogue costs "
          "no extra pass over the output", "igemm", ({}, {"BK": 32, "STAGES": 2, "MIN_BLOCKS": 2}), round0=True),
    Entry("cepi-direct", "Direct convolution with the epilogue fused: a TH x TW*PTX output tile for OCB channels "
          "of one group per block, the zero-padded input patch in shared memory split by stride phase "
          "(conflict-free for any stride and dilation), weights as [c][kh][kw][oc] float4 broadcasts, "
          "OCT x PTY x PTX outputs per thread in registers.", C,
          "FFMA-bound inner loop; competitive with the implicit GEMM at small C or few output channels",
          "direct", ({},), round0=True),
    Entry("cepi-depthwise", "Depthwise kernel (each output channel reads one input channel): a spatial output "
          "tile of one (n, channel) plane per block with its input patch in shared memory, PTY x PTX outputs "
          "per thread; each distinct patch row is read once per thread (float4) and feeds every tap that needs "
          "it; the epilogue before float4 stores.", M,
          "memory-bound: close to one read of x and one write of the output, ~70-85% of DRAM bandwidth",
          "depthwise", ({}, {"PTY": 2, "BY": 16}), round0=True),
    Entry("cepi-igemm-depth", "Re-balance the pipeline: its depth (STAGES) against shared memory and resident "
          "blocks, and a longer k-step (BK 32) so that the gathers of later tiles overlap more FFMAs.", A,
          "0-10% when the parent waits on loads or is short of resident blocks", "igemm",
          ({"STAGES": 3}, {"BK": 32, "STAGES": 3}), after=frozenset({"igemm"})),
    Entry("cepi-igemm-tile", "Re-shape the GEMM tile: a taller block (BM 256) re-uses each weight tile over more "
          "positions; a narrower one (BM 64) or two blocks per SM give more blocks when M is small.", PAR,
          "0-15%", "igemm", ({"BM": 256}, {"BM": 64, "MIN_BLOCKS": 2}), after=frozenset({"igemm"})),
    Entry("cepi-direct-cols", "Give each thread more columns (PTX) or rows (PTY) so that every weight broadcast "
          "from shared memory feeds more FFMAs.", C, "5-20% when the parent is shared-load bound", "direct",
          ({"PTX": 2}, {"PTX": 4, "TW": 16}), after=frozenset({"direct"})),
    Entry("cepi-direct-more-oc", "Register-block over more output channels per block (larger OCB and OCT): the "
          "staged input patch is reused by more channels.", C, "fewer shared-memory fills per FLOP; 5-15%",
          "direct", ({"OCB": 64, "OCT": 16}, {"OCT": 16}), after=frozenset({"direct"})),
    Entry("cepi-dw-tile", "Re-shape the depthwise tile: more outputs per thread (PTX 8 / PTY 8) re-use each "
          "patch row over more taps; smaller tiles give more blocks where the planes are small.", PAR,
          "0-15%", "depthwise", ({"PTX": 8}, {"PTY": 8, "BY": 4}, {"BX": 64, "BY": 4}),
          after=frozenset({"depthwise"})),
    Entry("cepi-dw-scalar", "Read the patch with scalar shared loads (VEC 0) and narrower column blocks, for "
          "strides where the float4 reads do not line up.", CF, "0-5%, sometimes negative", "depthwise",
          ({"VEC": 0}, {"VEC": 0, "PTX": 2}), after=frozenset({"depthwise"})),
)

CONV_EPI = Family(
    name=NAME, leads=frozenset({Lead.conv}), recognise=_recognise,
    constraints=("one conv1d or conv2d", "of a forward input", "elementwise after it"),
    variants={"igemm": build.conv_epi_igemm, "direct": build.conv_epi_direct, "depthwise": build.conv_epi_depthwise,
              "tf32x3": conv_epi_tf32x3, wgmma.VARIANT: wgmma.conv_epi_wgmma,  # wgmma*: Hopper only (coverage)
              s2d.VARIANT: s2d.conv_epi_s2d},
    # space-to-depth first in round 0 (KernelBench level-2 1: 3.54 ms against the gathered wgmma's 5.38, H200)
    ideas=s2d.CONV_EPI_S2D_IDEAS + wgmma.CONV_EPI_IDEAS + IDEAS + CONV_EPI_IDEAS,
    spec_names={v: build.SPEC_PREFIX + v for v in (*build.VARIANT_NAMES, wgmma.VARIANT, s2d.VARIANT)},
)
