"""TMA descriptors for ``tensormap`` launch arguments (:class:`~kerngen.harness.spec.spec.TensorMapArg`).

A ``tensormap`` argument names a tensor and a box; the harness builds the ``CUtensorMap`` with
the CUDA driver's ``cuTensorMapEncodeTiled``, copies its 128 bytes to device memory and passes
the kernel a pointer to them. The tensor (contiguous, 2 or more dims, bfloat16, float16 or
float32) is viewed as [outer, rows, cols]: rows = shape[-2], cols = shape[-1], outer = the product
of the leading dims (1 for a 2-D tensor). The map is rank 4, innermost dim first:

==========  =====================  =====================  ===================
dim         size                   stride (bytes)         box
==========  =====================  =====================  ===================
0           box_cols               (element)              box_cols
1           rows                   cols * esize           box_rows
2           cols / box_cols        box_cols * esize       cols / box_cols
3           outer                  rows * cols * esize    1
==========  =====================  =====================  ===================

With ``full_width`` off the map is rank 3 and its box one k tile of box_cols columns:

==========  =====================  =====================  ===================
dim         size                   stride (bytes)         box
==========  =====================  =====================  ===================
0           cols                   (element)              box_cols
1           rows                   cols * esize           box_rows
2           outer                  rows * cols * esize    1
==========  =====================  =====================  ===================

so one ``cp.async.bulk.tensor.3d`` load at {col0, row0, outer_index} brings [box_rows][box_cols]
(swizzled), columns past ``cols`` and rows past ``rows`` as zeros; cols need not be a multiple of
box_cols. A ``view`` (a shape of the same element count) is applied first.

element strides 1, interleave none, the spec's swizzle (0: none, 32/64/128: ``SWIZZLE_32B/64B/128B``),
L2 promotion 128B, out-of-bounds fill none (elements outside the tensor read as zeros). So one
``cp.async.bulk.tensor.4d`` load at {0, row0, 0, outer_index} brings ``box_rows`` rows of the
full width into shared memory as cols / box_cols slabs of [box_rows][box_cols] elements, each
swizzled; rows past ``rows`` are zeros (never the next outer index's data).

:func:`layout` is pure Python (no GPU library is imported by this module): the dims, strides and
box of a shape, dtype and box, and every refusal, each a one-line :class:`SpecError`;
:func:`check_plan` applies it to a resolved plan's arguments before any GPU (``kerngen check``).
:func:`encode` and :func:`device_map` run on a GPU only (the launcher, at bind time).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from kerngen.errors import SpecError
from kerngen.harness.spec.kparams import TENSORMAP_BYTES  # sizeof(CUtensorMap)
from kerngen.harness.spec.plan import MAX_TMA_BOX  # elements of a box along one dimension

TENSORMAP_ALIGN = 64  # the driver's alignment of a CUtensorMap
MAX_DIM = 2**32  # a dimension's size must stay below this
MAX_STRIDE = 2**40  # a stride (bytes) must stay below this
GLOBAL_ALIGN = 16  # the tensor's address and every stride
SWIZZLES = (0, 32, 64, 128)
ELEMENT_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class TensorMapLayout:
    """What ``cuTensorMapEncodeTiled`` is given (the address aside); every tuple innermost first."""

    dtype: str  # "bfloat16" | "float16" | "float32"
    element_bytes: int
    dims: tuple[int, ...]  # (box_cols, rows, cols // box_cols, outer); not full width: (cols, rows, outer)
    strides: tuple[int, ...]  # bytes, of dims 1..: (cols, box_cols, rows * cols) * esize; (cols, rows * cols) * esize
    box: tuple[int, ...]  # (box_cols, box_rows, cols // box_cols, 1); not full width: (box_cols, box_rows, 1)
    swizzle: int  # bytes: 0, 32, 64 or 128

    @property
    def box_bytes(self) -> int:
        """Bytes one load brings to shared memory (out-of-bounds zeros included): the mbarrier's expect_tx."""
        return math.prod(self.box) * self.element_bytes


def layout(shape: Sequence[int], dtype: str, box_rows: int, box_cols: int, swizzle: int = 128, *,
           full_width: bool = True, view: Sequence[int] | None = None, contiguous: bool = True,
           data_ptr: int | None = None, what: str = "tensormap") -> TensorMapLayout:
    """The map of a tensor of ``shape`` and ``dtype`` (a name: ``"bfloat16"``) for a box of
    ``box_rows`` x ``box_cols`` (all the columns' slabs, or with ``full_width`` off one tile of
    box_cols columns), the tensor viewed as ``view`` first where given, or a :class:`SpecError`
    whose message starts with ``what``. ``data_ptr`` (the tensor's address) is checked for its
    alignment where given."""
    shape = tuple(int(s) for s in shape)
    if not contiguous:
        raise SpecError(f"{what}: the tensor is not contiguous")
    if view is not None:
        view = tuple(int(v) for v in view)
        if math.prod(view) != math.prod(shape) or min(view, default=0) <= 0:
            raise SpecError(f"{what}: the view {view} ({math.prod(view)} elements) is not a shape of the tensor "
                            f"{shape} ({math.prod(shape)} elements)")
        shape = view
    if len(shape) < 2:
        raise SpecError(f"{what}: the tensor has {len(shape)} dim{'s' if len(shape) != 1 else ''} "
                        f"{shape}; a tensormap needs 2 or more")
    if dtype not in ELEMENT_BYTES:
        raise SpecError(f"{what}: dtype {dtype} is not supported (bfloat16, float16 or float32)")
    if swizzle not in SWIZZLES:
        raise SpecError(f"{what}: swizzle {swizzle} is not 0, 32, 64 or 128")
    for name, value in (("box_rows", box_rows), ("box_cols", box_cols)):
        if not 1 <= value <= MAX_TMA_BOX:
            raise SpecError(f"{what}: {name} {value} is not in 1..{MAX_TMA_BOX}")
    esize = ELEMENT_BYTES[dtype]
    rows, cols, outer = shape[-2], shape[-1], math.prod(shape[:-2])
    if min(shape) <= 0:
        raise SpecError(f"{what}: the tensor {shape} is empty")
    if full_width and cols % box_cols:
        raise SpecError(f"{what}: cols {cols} (shape[-1]) is not a multiple of box_cols {box_cols}")
    slabs = cols // box_cols
    if full_width and slabs > MAX_TMA_BOX:
        raise SpecError(f"{what}: cols / box_cols = {cols} / {box_cols} = {slabs} slabs; at most {MAX_TMA_BOX}")
    if (cols * esize) % GLOBAL_ALIGN:  # first: with it, a box_cols of whole 16 bytes is what is left to check
        raise SpecError(f"{what}: a row of cols {cols} x {esize} bytes = {cols * esize} bytes is not a multiple of 16")
    inner = box_cols * esize
    if inner % GLOBAL_ALIGN:
        raise SpecError(f"{what}: box_cols {box_cols} x {esize} bytes = {inner} bytes is not a multiple of 16")
    if swizzle and inner > swizzle:
        raise SpecError(f"{what}: box_cols {box_cols} x {esize} bytes = {inner} bytes is more than the swizzle "
                        f"of {swizzle} bytes (box_cols <= {swizzle // esize})")
    if data_ptr is not None and data_ptr % GLOBAL_ALIGN:
        raise SpecError(f"{what}: the tensor's address is not 16-byte aligned (offset {data_ptr % GLOBAL_ALIGN})")
    if full_width:
        dims: tuple[int, ...] = (box_cols, rows, slabs, outer)
        names: tuple[str, ...] = ("box_cols", "rows", "cols / box_cols", "outer")
        strides: tuple[int, ...] = (cols * esize, inner, rows * cols * esize)
        box: tuple[int, ...] = (box_cols, box_rows, slabs, 1)
    else:
        dims, names = (cols, rows, outer), ("cols", "rows", "outer")
        strides, box = (cols * esize, rows * cols * esize), (box_cols, box_rows, 1)
    for size, name in zip(dims, names):
        if size >= MAX_DIM:
            raise SpecError(f"{what}: dim {name} = {size} is 2**32 or more")
    if strides[-1] >= MAX_STRIDE:
        raise SpecError(f"{what}: rows x cols = {rows} x {cols} elements are 2**40 bytes or more")
    return TensorMapLayout(dtype=dtype, element_bytes=esize, dims=dims, strides=strides, box=box, swizzle=swizzle)


def check_plan(plan: Any, tensors: Mapping[str, tuple[Sequence[int], str]]) -> None:
    """Every ``tensormap`` argument of ``plan`` (a ``ResolvedPlan``) against its tensor's shape
    and dtype name in ``tensors`` (what is known before any GPU: contiguity and the address are
    the launcher's to check); the first refusal is a :class:`SpecError`. A name not in
    ``tensors`` is passed over (the launcher reports it)."""
    for index, step in enumerate(plan.steps):
        for pos, arg in enumerate(getattr(step, "args", ())):
            if arg.kind != "tensormap" or arg.name not in tensors:
                continue
            shape, dtype = tensors[arg.name]
            what = f"step {index}: kernel '{step.kernel}' argument {pos}: tensormap of '{arg.name}'"
            layout(shape, dtype, arg.box[0], arg.box[1], arg.swizzle, full_width=arg.full_width, view=arg.view,
                   what=what)


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (a string is returned as it is)."""
    return str(dtype).removeprefix("torch.")


def layout_for(tensor: Any, box_rows: int, box_cols: int, swizzle: int, what: str = "tensormap", *,
               full_width: bool = True, view: Sequence[int] | None = None) -> TensorMapLayout:
    """:func:`layout` of a torch tensor (its shape, dtype, contiguity and address)."""
    return layout(tuple(tensor.shape), dtype_name(tensor.dtype), box_rows, box_cols, swizzle, full_width=full_width,
                  view=view, contiguous=bool(tensor.is_contiguous()), data_ptr=int(tensor.data_ptr()), what=what)


def encode(lay: TensorMapLayout, data_ptr: int, what: str = "tensormap") -> bytes:
    """The 128 bytes of the ``CUtensorMap`` of ``lay`` at ``data_ptr`` (``cuTensorMapEncodeTiled``;
    needs the CUDA driver). A failing encode is a :class:`SpecError` naming its ``CUresult``."""
    from cuda.bindings import driver as cu

    (err,) = cu.cuInit(0)  # the process's driver is initialised already (torch); this is cheap
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SpecError(f"{what}: cuInit failed: {err.name}")
    dtypes = {"bfloat16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
              "float16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
              "float32": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}
    swizzles = {0: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
                32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
                64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
                128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    err, tmap = cu.cuTensorMapEncodeTiled(
        dtypes[lay.dtype], len(lay.dims), data_ptr,
        [cu.cuuint64_t(d) for d in lay.dims],
        [cu.cuuint64_t(s) for s in lay.strides],
        [cu.cuuint32_t(b) for b in lay.box],
        [cu.cuuint32_t(1) for _ in lay.dims],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzles[lay.swizzle],
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SpecError(f"{what}: cuTensorMapEncodeTiled failed with {err.name} (dims {lay.dims}, strides "
                        f"{lay.strides} bytes, box {lay.box}, swizzle {lay.swizzle})")
    words = [int(w) for w in tmap.opaque]
    return struct.pack(f"<{len(words)}Q", *words)


def device_map(tensor: Any, box_rows: int, box_cols: int, swizzle: int, what: str = "tensormap", *,
               full_width: bool = True, view: Sequence[int] | None = None) -> Any:
    """The tensor map of ``tensor`` in device memory: a 128-byte uint8 tensor on the tensor's
    device, 64-byte aligned (a view of a slightly larger allocation; keep it as long as a kernel
    may read it). Copied synchronously: written before anything later on the current stream."""
    import torch

    lay = layout_for(tensor, box_rows, box_cols, swizzle, what, full_width=full_width, view=view)
    data = encode(lay, int(tensor.data_ptr()), what)
    view = aligned_buffer(tensor.device)
    view.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return view


def aligned_buffer(device: Any) -> Any:
    """Room for one map on ``device``: a 128-byte uint8 view, 64-byte aligned, of a slightly
    larger allocation from torch's caching allocator."""
    import torch

    buf = torch.empty(TENSORMAP_BYTES + TENSORMAP_ALIGN, dtype=torch.uint8, device=device)
    offset = -buf.data_ptr() % TENSORMAP_ALIGN  # 0 with torch's allocator (512-byte blocks)
    return buf[offset : offset + TENSORMAP_BYTES]


__all__ = ["ELEMENT_BYTES", "TENSORMAP_ALIGN", "TENSORMAP_BYTES", "TensorMapLayout", "aligned_buffer", "check_plan",
           "device_map", "dtype_name", "encode", "layout", "layout_for"]
