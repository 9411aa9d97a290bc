"""The ATen ops a model plan may run as PyTorch fallback steps: an allowlist by op name, each resolved to
``torch.ops.aten.<op>.<overload>`` with a functional schema (no in-place or ``out=`` op). Nothing else a plan
names is ever looked up: a plan is data from a run folder, and an op name outside this set is refused.

It holds every op of the playbook's op table (:mod:`kerngen.agent.playbook.ops`, which sits above the harness:
``tests/harness/test_model_plan.py`` keeps the two in step) and the ops whole models use that no family computes
(recurrent cells and layers, splits, constructors, indexing).
"""

from __future__ import annotations

from typing import Any

from kerngen.errors import KerngenError

__all__ = ["ALLOWED", "GETITEM", "PlanError", "resolve_op"]

GETITEM = "getitem"  # an item of a tuple-valued op (split, lstm): not an ATen op, done by the executor itself


class PlanError(KerngenError):
    """A model plan that cannot run: an op outside the allowlist, a bad argument, a missing tensor."""


_TABLE = """
relu gelu sigmoid tanh silu mish hardsigmoid hardswish selu logsigmoid neg abs exp expm1 log log1p sqrt rsqrt
square reciprocal sin cos erf floor ceil trunc round negative log_sigmoid special_expit leaky_relu elu softplus
threshold hardtanh relu6 clamp clamp_min clamp_max clip add sub subtract rsub mul multiply div divide true_divide
pow maximum minimum fmax fmin where masked_fill gt ge lt le eq ne clone contiguous dropout alias detach
lift_fresh_copy positive zeros_like ones_like full_like view reshape _unsafe_view unsqueeze squeeze flatten
unflatten expand expand_as permute transpose t numpy_T mT movedim select narrow slice view_as broadcast_tensors
_to_copy to type_as sum mean prod amax amin max min argmax argmin logsumexp linalg_vector_norm norm var std
var_mean std_mean all any median mode cumsum cumprod cummax cummin logcumsumexp softmax log_softmax _softmax
_log_softmax linear matmul mm bmm addmm einsum baddbmm bilinear conv1d conv2d conv3d conv_transpose1d
conv_transpose2d conv_transpose3d convolution max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d
adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d adaptive_avg_pool1d adaptive_avg_pool2d
adaptive_avg_pool3d max_pool1d_with_indices max_pool2d_with_indices max_pool3d_with_indices batch_norm group_norm
layer_norm instance_norm rms_norm mse_loss l1_loss smooth_l1_loss huber_loss kl_div binary_cross_entropy
binary_cross_entropy_with_logits soft_margin_loss cross_entropy_loss triplet_margin_loss nll_loss
scaled_dot_product_attention cat stack flip roll triu tril diag gather index_select pad repeat
"""
_MODELS = """
split split_with_sizes unbind chunk tensor_split zeros ones full arange scalar_tensor new_zeros new_ones new_full
lstm gru rnn_tanh rnn_relu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell embedding index index_put
native_layer_norm native_batch_norm _native_batch_norm_legit_no_training native_group_norm constant_pad_nd
upsample_nearest2d upsample_bilinear2d pixel_shuffle channel_shuffle hardshrink softshrink erfinv sign
"""
ALLOWED: frozenset[str] = frozenset((_TABLE + _MODELS).split()) | {GETITEM}


def resolve_op(op: str, overload: str) -> Any:
    """``torch.ops.aten.<op>.<overload>`` for an allowed op with a functional schema; PlanError otherwise."""
    import torch

    if op not in ALLOWED or op == GETITEM:
        raise PlanError(f"ATen op {op!r} is not one a model plan may run (not in kerngen's allowlist)")
    packet = getattr(torch.ops.aten, op, None)
    known = packet.overloads() if packet is not None else []
    fn = getattr(packet, overload) if overload in known else None
    if not isinstance(fn, torch._ops.OpOverload):
        raise PlanError(f"ATen op {op}.{overload} does not exist in this PyTorch")
    schema = fn._schema
    if schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        raise PlanError(f"ATen op {op}.{overload} writes one of its arguments: a plan runs functional ops only")
    return fn
