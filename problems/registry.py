"""The built-in suite: ``problems/suite/<name>.py``, each a valid KernelBench-format file.

A built-in file also declares, at module level, what ``--shape`` and ``--dtype`` override:

- ``SHAPE``: the default shape (a tuple of ints). Its meaning is per problem (``SHAPE_DOC``).
- ``SHAPE_NAMES``: names of the shape's dims; they become problem sizes (``rows``, ``M``, ...).
- ``SHAPE_ARITY`` (optional): the accepted lengths of a shape override (default: the length of
  ``SHAPE_NAMES``).
- ``canonical_shape(shape)`` (optional): turns an accepted shape into the full one (matmul: a
  single ``N`` becomes ``(N, N, N)``); raises ``ValueError`` for a shape it refuses.
- ``shape_of_inputs(shapes)`` (optional): ``SHAPE`` from the inputs' shapes, then the parameters' (in
  the model's order), for an exported op's fallback at a shape it was not exported at, and for the
  comparison of its first call with PyTorch (default: the first input's shape is ``SHAPE``).
- ``DTYPE``: the default dtype (a ``torch.dtype``).

``get_inputs()`` and ``get_init_inputs()`` read ``SHAPE`` and ``DTYPE`` when they are called, so
the loader overrides them after import (see :func:`kerngen.problems.load.load_problem`).

This module reads the suite's files with :mod:`ast` only, so listing is fast and needs no torch.
"""

from __future__ import annotations

import ast
import difflib
import functools
from pathlib import Path

from kerngen.errors import ProblemError

SUITE_DIR = Path(__file__).resolve().parent / "suite"

# listing order (the brief's order); files found beyond these follow alphabetically
_ORDER = ("softmax", "layernorm", "rmsnorm", "gelu", "conv2d", "conv2d_wide", "conv_relu_maxpool", "matmul", "matmul_wide",
          "attention")


def builtin_names() -> list[str]:
    found = {p.stem for p in SUITE_DIR.glob("*.py") if not p.stem.startswith("_")}
    return [n for n in _ORDER if n in found] + sorted(found - set(_ORDER))


def is_builtin(name: str) -> bool:
    return name in builtin_names()


def builtin_path(name: str) -> Path:
    path = SUITE_DIR / f"{name}.py"
    if name.startswith("_") or "/" in name or not path.is_file():
        raise ProblemError(f"unknown built-in problem {name!r}{did_you_mean(name)} "
                           f"(built-ins: {', '.join(builtin_names())})")
    return path


def close_builtins(name: str, n: int = 3) -> list[str]:
    """Built-in names close to ``name`` (a typo: ``softmx``, ``layer_norm``, ``RMSNorm.py``)."""
    if not isinstance(name, str) or "/" in name or "\\" in name:
        return []
    stem = name[:-3] if name.endswith(".py") else name
    names = builtin_names()
    plain = {n.replace("_", ""): n for n in names}
    key = stem.lower().replace("-", "").replace("_", "")
    found = difflib.get_close_matches(key, list(plain), n=n, cutoff=0.6)
    return [plain[f] for f in found]


def did_you_mean(name: str) -> str:
    """``"; did you mean 'softmax'?"`` for a name close to built-ins, else ``""``."""
    close = close_builtins(name)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


@functools.cache
def _facts(path: Path, mtime: float) -> dict:
    tree = ast.parse(path.read_text(), filename=str(path))
    facts: dict = {"shape": None, "shape_names": None, "shape_doc": "", "dtype": "float32", "description": ""}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        try:
            if target.id == "SHAPE":
                facts["shape"] = tuple(ast.literal_eval(node.value))
            elif target.id == "SHAPE_NAMES":
                facts["shape_names"] = tuple(ast.literal_eval(node.value))
            elif target.id == "SHAPE_DOC":
                facts["shape_doc"] = str(ast.literal_eval(node.value))
            elif target.id == "DTYPE" and isinstance(node.value, ast.Attribute):
                facts["dtype"] = node.value.attr
            elif target.id == "KERNGEN_META" and isinstance(node.value, ast.Dict):
                for k, v in zip(node.value.keys, node.value.values):
                    if isinstance(k, ast.Constant) and k.value == "description":
                        facts["description"] = str(ast.literal_eval(v))
        except ValueError:
            continue
    return facts


def builtin_facts(name: str) -> dict:
    """Default shape, dtype, shape meaning and description of a built-in, without importing it."""
    path = builtin_path(name)
    return dict(_facts(path, path.stat().st_mtime), name=name)


def describe_builtin_shapes() -> dict[str, str]:
    """name -> what ``--shape`` means for it and its default, e.g.
    ``"input (rows, cols), softmax over dim 1; default 4096x65536 float32"``."""
    out: dict[str, str] = {}
    for name in builtin_names():
        f = builtin_facts(name)
        default = "x".join(str(s) for s in f["shape"] or ())
        out[name] = f"{f['shape_doc']}; default {default} {f['dtype']}".strip("; ")
    return out
