"""A copy of a KernelBench-format file that runs in another dtype (``kerngen problems FILE --to-dtype bf16 --out
DIR``): ``--dtype`` reaches the built-ins only (their ``DTYPE``), so a KernelBench GEMM or convolution is asked
for at bf16 / fp16 through such a copy, an ordinary KernelBench file that every command loads as it loads any.

The copy is the file's text unchanged, then an appended block that (1) wraps ``get_inputs`` so that its floating
tensors come out in the dtype (integer tensors and Python numbers pass as they are) and (2) wraps
``Model.__init__`` so that the model's parameters and buffers are moved to the dtype once built. ``class Model``
and its ``forward`` stay the only ones (the playbook reads the forward's source), so the copy is recognised as the
original is. A forward that makes tensors of its own dtype (``torch.ones(...)`` without ``dtype=``) may then mix
dtypes: loading the copy says so, in one line. The harness checks the copy at the dtype's tolerance (bf16 1e-2).
"""

from __future__ import annotations

from pathlib import Path

from kerngen.errors import ProblemError
from kerngen.problems.ref import canonical_dtype

__all__ = ["COPY_DTYPES", "dtype_copy", "dtype_copy_name"]

COPY_DTYPES = ("bfloat16", "float16", "float32")
MARKER = "# ---- kerngen: a {dtype} copy of {name} (kerngen problems --to-dtype) ----"
_ADAPTER = '''

{marker}
import torch as _kg_torch

_KG_DTYPE = _kg_torch.{dtype}
_kg_get_inputs = get_inputs
_kg_model_init = Model.__init__


def get_inputs():
    return [x.to(_KG_DTYPE) if isinstance(x, _kg_torch.Tensor) and x.is_floating_point() else x
            for x in _kg_get_inputs()]


def _kg_init(self, *args, **kwargs):
    _kg_model_init(self, *args, **kwargs)
    self.to(_KG_DTYPE)


Model.__init__ = _kg_init
'''


def dtype_copy_name(path: Path, dtype: str) -> str:
    """``12_Gemm_ReLU.py`` -> ``12_Gemm_ReLU_bf16.py``."""
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[canonical_dtype(dtype)]
    return f"{path.stem}_{short}.py"


def dtype_copy(path: Path, dtype: str) -> str:
    """The text of the copy of the KernelBench file ``path`` in ``dtype``; :class:`ProblemError` for a dtype the
    playbook does not compute in, a file that is not text or has no ``Model`` / ``get_inputs``, or a copy
    (copying a copy would stack the wrappers)."""
    name = canonical_dtype(dtype)
    if name not in COPY_DTYPES:
        raise ProblemError(f"--to-dtype {dtype}: one of bf16, fp16, fp32")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(f"{path}: cannot read it as text ({type(exc).__name__})") from None
    if "(kerngen problems --to-dtype)" in text:
        raise ProblemError(f"{path}: already a dtype copy; copy the original")
    for needed in ("class Model", "def get_inputs"):
        if needed not in text:
            raise ProblemError(f"{path}: no '{needed}': not a KernelBench-format file")
    marker = MARKER.format(dtype=name, name=Path(path).name)
    return text.rstrip("\n") + "\n" + _ADAPTER.format(marker=marker, dtype=name)
