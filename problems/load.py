"""Loading a problem, once per process: a built-in (by name) or a KernelBench-format file (by
path) is read, hashed, imported, checked and described (:class:`~.problem.Problem` traces it on
the meta device) the first time it is asked for; later calls with the same
:class:`~.ref.ProblemRef` and the same file content get the same :class:`~.problem.Problem`.
An edited file (another sha256) loads again. Failures are not cached.

Built-ins take shape and dtype overrides through their module-level ``SHAPE`` / ``DTYPE``
(:mod:`kerngen.problems.registry`); each ref gets its own module, so overrides never leak.
"""

from __future__ import annotations

import os

import hashlib
import importlib.util
import itertools
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

from kerngen.errors import ProblemError

from kerngen.problems import registry
from kerngen.problems.info import ProblemInfo, shape_str
from kerngen.problems.problem import Problem, exc_line
from kerngen.problems.ref import ProblemRef, canonical_dtype

__all__ = ["clear_cache", "describe_problem", "load_problem", "normalize_ref"]

_META_KEYS = {"atol", "rtol", "flops", "min_bytes", "description"}

_load_counter = itertools.count()
_cache: dict[tuple[ProblemRef, str, str], Problem] = {}  # (ref, resolved path, sha256) -> problem
_lock = threading.RLock()


def load_problem(ref: ProblemRef | str | os.PathLike) -> Problem:
    """The problem ``ref`` names (str = built-in name or path; a path object), loaded once per process for each
    (ref, file content). Raises :class:`ProblemError` (one line naming the file) for anything that
    cannot be loaded or described."""
    ref = normalize_ref(ref)
    path, builtin = _resolve_source(ref.source)
    data = _read(path)
    digest = hashlib.sha256(data).hexdigest()
    key = (ref, str(path), digest)
    with _lock:
        problem = _cache.get(key)
        if problem is None:
            problem = _load(ref, path, builtin, data, digest)
            _cache[key] = problem
        return problem


def describe_problem(ref: ProblemRef | str) -> ProblemInfo:
    """The problem's description (meta tensors), from the same cache as :func:`load_problem`."""
    return load_problem(ref).info


def clear_cache() -> None:
    """Forget every loaded problem (the next load imports its file again)."""
    with _lock:
        _cache.clear()


def normalize_ref(ref: ProblemRef | str | os.PathLike) -> ProblemRef:
    """Canonical dtype names (``bf16`` -> ``bfloat16``); shapes stay as given until loaded."""
    if isinstance(ref, (str, os.PathLike)):
        ref = ProblemRef(source=os.fspath(ref))
    if ref.dtype is not None:
        ref = ref.model_copy(update={"dtype": canonical_dtype(ref.dtype)})
    return ref


# ---------------------------------------------------------------------------------------------


def _load(ref: ProblemRef, path: Path, builtin: bool, data: bytes, digest: str) -> Problem:
    module = _import_file(path, data)
    _check_module(module, path)
    ref = _apply_overrides(module, ref, path, builtin)
    return Problem(ref, path, module, builtin, text=importlib.util.decode_source(data), sha256=digest)


def _resolve_source(source: str) -> tuple[Path, bool]:
    """(path, is_builtin). A bare built-in name wins over a same-named file without ``.py``."""
    if registry.is_builtin(source) and not source.endswith(".py") and "/" not in source:
        return registry.builtin_path(source), True
    path = Path(source).expanduser()
    if not path.is_file():
        if path.is_dir():
            raise ProblemError(f"{source} is a folder, not a problem file")
        raise ProblemError(
            f"problem {source!r} not found: neither a file nor a built-in{registry.did_you_mean(source)} "
            f"({', '.join(registry.builtin_names())})"
        )
    path = path.resolve()
    builtin = path.parent == registry.SUITE_DIR and registry.is_builtin(path.stem)
    return path, builtin


def import_module(path: Path) -> ModuleType:
    """The Python file at ``path`` run as a fresh module (a user's own KernelBench solution, which
    they named: ``kerngen bench --solution``); :class:`ProblemError` when it cannot be read or raises."""
    return _import_file(path, _read(path))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ProblemError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _import_file(path: Path, data: bytes) -> ModuleType:
    """Run ``data`` (the bytes just read and hashed, not whatever the file holds by now) as a fresh
    module named after ``path``; no bytecode is written next to the file."""
    stem = re.sub(r"\W", "_", path.stem)
    name = f"kerngen_problem_{stem}_{next(_load_counter)}"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ProblemError(f"{path}: cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
    except ProblemError:
        raise
    except Exception as exc:
        raise ProblemError(f"{path}: cannot be imported: {exc_line(exc)}") from None
    sys.modules[name] = module  # inspect.getsource, dataclasses and pickling look modules up here
    try:
        code = compile(data, str(path), "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise ProblemError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise ProblemError(f"{path}: error while importing: {exc_line(exc)}") from None
    return module


def _check_module(module: ModuleType, path: Path) -> None:
    from torch import nn

    model = getattr(module, "Model", None)
    if model is None:
        raise ProblemError(f"{path}: no `class Model(nn.Module)` defined")
    if not (isinstance(model, type) and issubclass(model, nn.Module)):
        raise ProblemError(f"{path}: `Model` must be a subclass of torch.nn.Module")
    if not callable(getattr(module, "get_inputs", None)):
        raise ProblemError(f"{path}: no `get_inputs()` function defined")
    init = getattr(module, "get_init_inputs", None)
    if init is not None and not callable(init):
        raise ProblemError(f"{path}: `get_init_inputs` must be a function")
    meta = getattr(module, "KERNGEN_META", None)
    if meta is not None:
        if not isinstance(meta, dict):
            raise ProblemError(f"{path}: KERNGEN_META must be a dict")
        unknown = set(meta) - _META_KEYS
        if unknown:
            raise ProblemError(
                f"{path}: unknown KERNGEN_META key(s) {', '.join(sorted(map(str, unknown)))} "
                f"(known: {', '.join(sorted(_META_KEYS))})"
            )
        for key in ("atol", "rtol"):
            if key in meta and (not isinstance(meta[key], (int, float)) or meta[key] < 0):
                raise ProblemError(f"{path}: KERNGEN_META[{key!r}] must be a number >= 0")


def _apply_overrides(module: ModuleType, ref: ProblemRef, path: Path, builtin: bool) -> ProblemRef:
    """Set SHAPE / DTYPE of a built-in from the ref; return the ref with the canonical shape."""
    import torch

    if not builtin:
        if ref.shape is not None or ref.dtype is not None:
            raise ProblemError(
                f"{path}: --shape/--dtype apply to built-in problems only; edit the file's sizes instead"
            )
        return ref
    name = path.stem
    names = tuple(getattr(module, "SHAPE_NAMES", ()))
    doc = getattr(module, "SHAPE_DOC", "")
    if ref.shape is not None:
        shape = tuple(ref.shape)
        arity = tuple(getattr(module, "SHAPE_ARITY", (len(names),)))
        if len(shape) not in arity:
            want = " or ".join(str(a) for a in arity)
            raise ProblemError(
                f"{name}: shape {shape_str(shape)} has {len(shape)} dim(s), expected {want} ({doc})"
            )
        if any(int(d) <= 0 for d in shape):
            raise ProblemError(f"{name}: shape {shape_str(shape)} has a dimension <= 0")
        canon = getattr(module, "canonical_shape", None)
        if callable(canon):
            try:
                shape = tuple(int(d) for d in canon(shape))
            except ValueError as exc:
                raise ProblemError(f"{name}: shape {shape_str(shape)} refused: {exc}") from None
        module.SHAPE = shape
        ref = ref.model_copy(update={"shape": shape})
    if ref.dtype is not None:
        module.DTYPE = getattr(torch, canonical_dtype(ref.dtype))
    return ref
