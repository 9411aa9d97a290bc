"""2-D convolution (the suite's conv2d: 3 -> 96 channels, kernel 11, stride 4, padding 2, bias) whose
input and weights span a wide dynamic range: the conv counterpart of ``matmul_wide``.

As an implicit GEMM the conv is out[m][oc] = sum_k A[m][k] * B[k][oc] with m = (n, oh, ow) and
k = (c, kh, kw). The suite's conv2d draws x from N(0, 1): every element of a row of A has about the
same size, so a kernel that splits or quantises its operands in a way that only works for such data
(an fp16 split, one fixed-point scale per row or per tile, a TF32 product) can pass it. Here:

- sample n of x is multiplied by 10**r_n, r_n uniform in [-3, 0] (A's rows): outputs of one batch
  differ by three orders of magnitude, so the elementwise check is relative, not absolute, in the
  large samples;
- input channel c of x is multiplied by 10**v_c and the weights of channel c by 10**-v_c, v_c evenly
  spaced over [-3, 3] (-3, 0, 3 for three channels): the products keep the sizes they have in conv2d
  (the scales cancel), but along a row of A the elements span 10**6 times their normal spread, and a
  kernel that loses the small ones (a per-row or per-tile exponent, an fp16 split that underflows)
  drops products that matter;
- the weights of output channel oc are multiplied by 10**u_oc, u_oc uniform in [-0.5, 0.5] (B's columns).

The weights are a buffer, not a parameter: the harness perturbs every parameter by 0.1 * randn * its
std (one std for the whole tensor), which would bury the channels scaled by 10**-3 under the noise of
the ones scaled by 10**3 and undo the cancellation; buffers are left as built (seeded by the harness).
The outputs are O(1) at most (~3 in the tails), so fp32 stays checkable at atol = rtol = 1e-4.
"""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (100, 3, 224, 224)
SHAPE_NAMES = ("batch", "in_channels", "height", "width")
SHAPE_DOC = "input NCHW (batch, in_channels, height, width); conv to 96 channels, k11 s4 p2, bias; wide-range data"
DTYPE = torch.float32
out_channels = 96
kernel_size = 11
stride = 4
padding = 2
_SAMPLE_EXP = (-3.0, 0.0)  # x's samples scaled by 10**U(_SAMPLE_EXP)
_CHANNEL_EXP = 3.0  # x's channel c by 10**v_c, its weights by 10**-v_c, v_c evenly spaced over [-3, 3]
_OUT_EXP = (-0.5, 0.5)  # output channel oc's weights scaled by 10**U(_OUT_EXP)
KERNGEN_META = {
    "description": "out = conv2d(x, weight, bias, stride=4, padding=2), weight (96, in_channels, 11, 11), bias "
    "(96,), NCHW, over a wide dynamic range: x's samples scaled by 10**U(-3, 0), x's channel c by 10**v_c and "
    "its weights by 10**-v_c (v_c evenly over [-3, 3], cancelling in the products), output channel oc's "
    "weights by 10**U(-0.5, 0.5). Catches kernels that pass on N(0, 1) data only: fp16 splits, per-row or "
    "per-tile fixed-point scales, TF32 products"
}


def _channel_exponents(c: int) -> torch.Tensor:
    """v_c, evenly spaced over [-_CHANNEL_EXP, _CHANNEL_EXP] (0 for a single channel)."""
    if c == 1:
        return torch.zeros(1, dtype=torch.float64)
    return torch.linspace(-_CHANNEL_EXP, _CHANNEL_EXP, c, dtype=torch.float64)


def _exp10(n, lo, hi):
    """n factors 10**u, u uniform in [lo, hi] (computed in float64, returned in DTYPE)."""
    u = torch.rand(n, dtype=torch.float64) * (hi - lo) + lo
    return torch.pow(10.0, u).to(DTYPE)


class Model(nn.Module):
    """A single Conv2d with bias; its weight a buffer scaled per input and output channel."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=True)
        inner = torch.pow(10.0, -_channel_exponents(in_channels)).to(DTYPE)
        scale = _exp10(out_channels, *_OUT_EXP)[:, None] * inner[None, :]
        weight = self.conv.weight.detach() * scale[:, :, None, None]
        del self.conv.weight
        self.conv.register_buffer("weight", weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    n, c = SHAPE[0], SHAPE[1]
    inner = torch.pow(10.0, _channel_exponents(c)).to(DTYPE)
    x = torch.randn(*SHAPE, dtype=DTYPE) * _exp10(n, *_SAMPLE_EXP)[:, None, None, None] * inner[None, :, None, None]
    return [x]


def get_init_inputs():
    return [SHAPE[1], out_channels, kernel_size, stride, padding]
