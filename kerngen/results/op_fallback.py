"""The problem's own PyTorch forward behind an exported op: what runs for a shape or dtype no kernel of
the export admits, and what tells the output shapes of a shape no kernel was checked at.

An export may come from anyone, so it never supplies Python: the fallback is the problem definition
the user has. Either the user passes it (``kerngen.load(EXPORT, fallback=model)``: the problem's
``Model`` instance, whose parameters and buffers are then the op's own arguments through
``torch.func.functional_call``, or any callable taking the op's arguments in order), or the export
names one of kerngen's built-in problems, whose file ships with kerngen (``problems/suite``) and is
loaded from there at the call's shapes, never from the export folder.

Output shapes come from running the fallback on meta tensors (else under a FakeTensorMode), once per
signature; a fallback that cannot run so leaves the shape unadmitted.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

from kerngen.problems.info import TensorInfo

Shapes = tuple  # ((shape, dtype), ...) of the op's arguments


class Fallback:
    """``call(args)`` runs the problem's forward on the op's arguments (inputs then params);
    ``output_shapes(shapes, device)`` says what it returns, without computing anything."""

    def __init__(self, make: Callable[[Shapes], Callable[..., Any]], what: str) -> None:
        self._make = make  # signature -> a function of the op's arguments
        self.what = what  # "the model passed as fallback" / "built-in problem softmax"
        self._shapes: dict[Shapes, list[tuple[tuple[int, ...], Any]] | None] = {}
        self._functions: dict[Shapes, Callable[..., Any]] = {}

    def function(self, shapes: Shapes) -> Callable[..., Any]:
        """The forward at ``shapes`` (made once per signature)."""
        fn = self._functions.get(shapes)
        if fn is None:
            fn = self._functions[shapes] = self._make(shapes)
        return fn

    def call(self, args: Sequence[Any]) -> Any:
        """The forward on ``args``; outputs that alias an argument are copied (an op's outputs are
        new tensors)."""
        import torch

        shapes = tuple((tuple(t.shape), t.dtype) for t in args)
        out = self.function(shapes)(*args)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        storages = {t.untyped_storage().data_ptr() for t in args if t.numel()}
        outs = [o.clone() if o.numel() and o.untyped_storage().data_ptr() in storages else o for o in outs]
        return outs[0] if isinstance(out, torch.Tensor) else tuple(outs)

    def output_shapes(self, shapes: Shapes, device: Any) -> list[tuple[tuple[int, ...], Any]] | None:
        """``[(shape, dtype), ...]`` of the outputs at ``shapes``, or None when the forward cannot
        run on meta or fake tensors (or fails there): then no kernel is used at those shapes."""
        if shapes not in self._shapes:
            self._shapes[shapes] = self._infer(shapes, device)
        return self._shapes[shapes]

    def _infer(self, shapes: Shapes, device: Any) -> list[tuple[tuple[int, ...], Any]] | None:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

        try:
            fn = self.function(shapes)
        except Exception:  # noqa: BLE001 - a problem that cannot be built at these shapes: not admitted
            return None
        with unset_fake_temporarily():  # called from a fake implementation too: plain meta tensors here
            for mode in (contextlib.nullcontext, lambda: FakeTensorMode(allow_non_fake_inputs=True)):
                try:
                    with mode(), torch.no_grad():
                        dev = "meta" if mode is contextlib.nullcontext else device
                        out = fn(*[torch.empty(shape, dtype=dtype, device=dev) for shape, dtype in shapes])
                    outs = [out] if isinstance(out, torch.Tensor) else list(out)
                    return [(tuple(int(d) for d in o.shape), o.dtype) for o in outs]
                except Exception:  # noqa: BLE001 - the user's forward on meta tensors: any failure says "unknown"
                    continue
        return None


def user_fallback(fallback: Any, inputs: Sequence[TensorInfo], params: Sequence[TensorInfo],
                  forward_args: Sequence[str], scalars: dict[str, int | float]) -> Fallback:
    """The fallback a user passed: an ``nn.Module`` (the problem's ``Model``: its parameters and
    buffers replaced by the op's arguments of those names) or a callable of the op's arguments.
    ValueError when a module lacks one of the export's parameters."""
    import torch

    if not isinstance(fallback, torch.nn.Module):
        if not callable(fallback):
            raise ValueError(f"fallback must be the problem's nn.Module or a callable, got {type(fallback).__name__}")
        return Fallback(lambda shapes: fallback, "the callable passed as fallback")
    names = _state_names(fallback, [p.name for p in params])
    call = _module_call(fallback, [t.name for t in inputs], names, forward_args, scalars)
    return Fallback(lambda shapes: call, f"the {type(fallback).__name__} passed as fallback")


def builtin_fallback(source: str, dtype: str | None, inputs: Sequence[TensorInfo], params: Sequence[TensorInfo],
                     forward_args: Sequence[str], scalars: dict[str, int | float]) -> Fallback | None:
    """The fallback of a built-in problem named by an export (kerngen's own file, at the call's
    shapes), or None when ``source`` names no built-in."""
    from kerngen.problems import registry

    if not isinstance(source, str) or "/" in source or "\\" in source or not registry.is_builtin(source):
        return None
    in_names, param_names = [t.name for t in inputs], [p.name for p in params]

    def make(shapes: Shapes) -> Callable[..., Any]:
        from kerngen.problems.load import load_problem
        from kerngen.problems.ref import ProblemRef

        floats = [str(d).removeprefix("torch.") for _, d in shapes if getattr(d, "is_floating_point", False)]
        at = floats[0] if floats else dtype  # the call's dtype: the built-in's DTYPE follows it
        first = load_problem(ProblemRef(source=source, dtype=at))
        hook = getattr(first.module, "shape_of_inputs", None)
        in_shapes = [tuple(s) for s, _ in shapes[:len(in_names)]]
        # the hook sees the parameters' shapes after the inputs' (a Linear's N is its weight's)
        shape = tuple(hook([*in_shapes, *(tuple(s) for s, _ in shapes[len(in_names):])])) if callable(hook) else in_shapes[0]
        problem = load_problem(ProblemRef(source=source, shape=shape, dtype=at))
        model = problem.build_model("meta")
        names = _state_names(model, param_names)
        return _module_call(model, in_names, names, forward_args, scalars)

    return Fallback(make, f"built-in problem {source}")


def _state_names(module: Any, params: Sequence[str]) -> list[str]:
    """The module's names of the export's parameters (``model.x`` is how a problem names a parameter
    ``x`` that clashes with an input)."""
    state = {n for n, _ in module.named_parameters()} | {n for n, _ in module.named_buffers()}
    out = []
    for name in params:
        real = name if name in state else name.removeprefix("model.")
        if real not in state:
            shown = ", ".join(sorted(state)[:8]) or "none"
            raise ValueError(f"the fallback module has no parameter or buffer {name!r} (it has: {shown})")
        out.append(real)
    return out


def _module_call(module: Any, inputs: list[str], params: list[str], forward_args: Sequence[str],
                 scalars: dict[str, int | float]) -> Callable[..., Any]:
    from torch.func import functional_call

    order = list(forward_args) or list(inputs)

    def call(*args: Any) -> Any:
        named = dict(zip(inputs, args[: len(inputs)]))
        state = dict(zip(params, args[len(inputs):]))
        forward = [named[n] if n in named else scalars[n] for n in order if n in named or n in scalars]
        return functional_call(module, state, tuple(forward), strict=False)

    return call


__all__ = ["Fallback", "builtin_fallback", "user_fallback"]
