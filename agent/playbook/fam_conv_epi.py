"""Playbook family ``conv_epi``: one ``nn.Conv1d`` / ``nn.Conv2d`` module (any stride, zero padding,
dilation, groups) applied to a forward input, followed by an elementwise epilogue (relu, mish, a
per-channel bias or scale, a residual input, ...) traced by :mod:`.epilogue` and applied in registers
before the store. A 1-D conv is a 2-D one with H = 1.

What stays with the built-in families (this recogniser returns None for it): a plain ``nn.Conv2d``
(groups 1, dilation 1, numeric padding, nothing after it, one input) is ``conv2d``'s; conv2d + one relu + one
max-pool is ``conv_relu_maxpool``'s. 3-D and transposed convolutions, functional ``F.conv*`` calls
and forwards with several convolutions are nobody's (None: the built-ins say "not covered"). A
single Conv1d/Conv2d followed by anything that is not elementwise (a reduction, a norm, a pool) is
this family's to refuse, with the tracer's reason.
"""

from __future__ import annotations

import ast
from typing import Any

from kerngen.agent.playbook import build_conv_epi as build
from kerngen.agent.playbook.build_conv_tf32 import CONV_EPI_IDEAS, conv_epi_tf32x3
from kerngen.agent.playbook.entry import A, C, CF, Entry, M, PAR
from kerngen.agent.playbook.epilogue import Epilogue, trace_epilogue
from kerngen.agent.playbook.family import Family
from kerngen.agent.playbook.forward_source import module_of
from kerngen.agent.playbook.match import FamilyMatch, Read, Tensor, param_for
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["FAMILY", "LEADS", "check_dtypes", "conv_input", "recognise"]

NAME = "conv_epi"
LEADS = ("Conv1d", "Conv2d")  # module types this family leads with; dims = 1, 2
_OTHER_CONVS = ("Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "conv1d", "conv2d", "conv3d",
                "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_RELU = ("relu", "relu_", "ReLU")
_MAXPOOL = ("MaxPool2d", "max_pool2d")


def _builtin_relu_pool(kind: str, rest: list[str]) -> bool:
    """conv2d + exactly one relu + one max-pool: the built-in conv_relu_maxpool family's shape."""
    return (kind == "Conv2d" and all(k in _RELU + _MAXPOOL for k in rest)
            and sum(k in _RELU for k in rest) == 1 and sum(k in _MAXPOOL for k in rest) == 1)


def _ints(v: Any, dims: int) -> tuple[int, ...]:
    t = tuple(int(e) for e in v) if isinstance(v, (tuple, list)) else (int(v),) * dims
    if len(t) != dims:
        raise NotCovered(f"cannot read a {dims}-D conv's geometry from {v!r}")
    return t


def _padding(mod: Any, dims: int, kernel: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[int, ...]:
    pad = mod.padding
    if pad == "valid":
        return (0,) * dims
    if pad == "same":  # torch pads d*(k-1) in all, the odd one on the right: symmetric only when even
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        if any(t % 2 for t in total):
            raise NotCovered("padding='same' with an odd total padding (asymmetric) is not covered by conv_epi")
        return tuple(t // 2 for t in total)
    if isinstance(pad, str):
        raise NotCovered(f"conv padding {pad!r} is not covered by conv_epi")
    return _ints(pad, dims)


def _geometry(kind: str, mod: Any) -> dict[str, int]:
    """C, OC, G and (KH, KW, SH, SW, PH, PW, DH, DW) of the module; a 1-D conv as H = 1."""
    if getattr(mod, "padding_mode", "zeros") != "zeros":
        raise NotCovered(f"conv padding_mode {mod.padding_mode!r} (not zeros) is not covered by conv_epi")
    dims = LEADS.index(kind) + 1
    k, s, d = _ints(mod.kernel_size, dims), _ints(mod.stride, dims), _ints(mod.dilation, dims)
    p = _padding(mod, dims, k, d)
    if dims == 1:
        k, s, p, d = (1, *k), (1, *s), (0, *p), (1, *d)
    return dict(dims=dims, C=int(mod.in_channels), OC=int(mod.out_channels), G=int(mod.groups),
                KH=k[0], KW=k[1], SH=s[0], SW=s[1], PH=p[0], PW=p[1], DH=d[0], DW=d[1])


def conv_input(r: Read, node: ast.Call, family: str = NAME) -> Tensor:
    """The forward input the conv call reads (its first argument by name; else the only input);
    ``family`` names the refusing family (conv_tail and conv_nd ask too)."""
    inputs = r.match.inputs
    arg = node.args[0] if node.args else None
    if isinstance(arg, ast.Name):
        hit = next((t for t in inputs if t.name == arg.id), None)
        if hit is not None:
            return hit
    if len(inputs) == 1:
        return inputs[0]
    raise NotCovered(f"cannot tell which forward input the convolution reads: not covered by {family}")


def _lead_shape(x: Tensor, g: dict[str, int]) -> tuple[int, ...]:
    """The conv's output shape, as torch computes it."""
    if len(x.shape) != g["dims"] + 2:
        raise NotCovered(f"a {g['dims']}-D conv over a {len(x.shape)}-D input is not covered by conv_epi")
    hw = (1, x.shape[2]) if g["dims"] == 1 else x.shape[2:]
    oh = (hw[0] + 2 * g["PH"] - g["DH"] * (g["KH"] - 1) - 1) // g["SH"] + 1
    ow = (hw[1] + 2 * g["PW"] - g["DW"] * (g["KW"] - 1) - 1) // g["SW"] + 1
    if oh < 1 or ow < 1:
        raise NotCovered("the convolution's output is empty at this input size")
    return (x.shape[0], g["OC"], ow) if g["dims"] == 1 else (x.shape[0], g["OC"], oh, ow)


def check_dtypes(r: Read, names: list[str], family: str = NAME) -> None:
    """fp32 inputs and fp32 parameters ``names``, else :class:`NotCovered` naming ``family``."""
    dtypes = set(r.dtypes) | {t.dtype for t in r.match.params if t.name in names}
    if dtypes != {"float32"}:
        raise NotCovered(f"{family} computes in fp32 only ({', '.join(sorted(dtypes - {'float32'}))} is not covered)")


def recognise(r: Read) -> FamilyMatch | None:
    convs = [(k, c, n) for k, c, n in r.kinds if k in LEADS]
    if len(convs) != 1 or any(k in _OTHER_CONVS for k in r.names):
        return None
    kind, callee, node = convs[0]
    mod = module_of(r.model, callee)
    if mod is None:
        return None  # no geometry to read (no meta model): the built-in conv2d family says why
    if _builtin_relu_pool(kind, [k for k in r.names if k != kind]):
        return None
    geo = _geometry(kind, mod)
    x = conv_input(r, node)
    shape = _lead_shape(x, geo)
    try:
        ep: Epilogue = trace_epilogue(r.model, (kind,), shapes={t.name: t.shape for t in r.match.inputs},
                                      lead_shape=shape, out_shape=r.out.shape, channel_dim=1)
    except NotCovered as exc:
        raise NotCovered(f"{kind} followed by what conv_epi cannot fuse as an elementwise epilogue: {exc}") from None
    plain = (ep.empty and geo["G"] == 1 and (geo["DH"], geo["DW"]) == (1, 1) and len(r.match.inputs) == 1
             and not isinstance(mod.padding, str))  # the built-in reads numeric padding only
    if kind == "Conv2d" and plain:
        return None  # the built-in conv2d family's
    weight = param_for(r.match.params, ep.lead, "weight")
    bias = param_for(r.match.params, ep.lead, "bias")
    if weight is None:
        raise NotCovered(f"no parameter {ep.lead}.weight among the model's parameters")
    tensors = {t.name for t in r.match.inputs + r.match.params}
    loose = [p.name for p in ep.params if p.name not in tensors]
    if loose:  # a Python number passed to forward: no tensor to bind as the kernel's operand
        raise NotCovered(f"the epilogue reads {loose[0]!r}, which is not a tensor: not covered by conv_epi")
    check_dtypes(r, [weight.name] + ([bias.name] if bias else []) + [p.name for p in ep.params])
    r.match.facts = dict(geo, x=x.name, weight=weight.name, bias=bias.name if bias else None, epilogue=ep,
                         formula=ep.formula or "none")
    return r.match


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

FAMILY = Family(
    name=NAME,
    recognise=recognise,
    variants={"igemm": build.conv_epi_igemm, "direct": build.conv_epi_direct, "depthwise": build.conv_epi_depthwise,
              "tf32x3": conv_epi_tf32x3},
    ideas=IDEAS + CONV_EPI_IDEAS,
    spec_names={v: build.SPEC_PREFIX + v for v in build.VARIANT_NAMES},
)
