"""A light reader of KernelBench-format files, shaped like a Problem (``.info``, ``.source()``,
``.build_model``), for the playbook's own tests and GPU checks. Shapes come from running the
reference on PyTorch's ``meta`` device: nothing is allocated, nothing is computed.

The real loader is :func:`kerngen.problems.problem.load_problem`; use it where it exists.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Info:
    name: str
    inputs: list[TensorInfo]
    params: list[TensorInfo]
    outputs: list[TensorInfo]
    sizes: dict[str, int] = field(default_factory=dict)


class KBProblem:
    def __init__(self, path: str | Path) -> None:
        import torch

        self.path = Path(path)
        self.name = self.path.stem
        self._text = self.path.read_text()
        self.module = types.ModuleType(f"kb_{self.name}")
        exec(compile(self._text, str(self.path), "exec"), self.module.__dict__)
        with torch.device("meta"):
            init = list(self.module.get_init_inputs())
            model = self.module.Model(*init)
            inputs = list(self.module.get_inputs())
            out = model(*inputs)
        names = [n for n in inspect.signature(self.module.Model.forward).parameters if n != "self"]
        outs = out if isinstance(out, (tuple, list)) else [out]
        dt = lambda t: str(t.dtype).replace("torch.", "")  # noqa: E731
        self.info = Info(
            name=self.name,
            inputs=[TensorInfo(n, tuple(t.shape), dt(t)) for n, t in zip(names, inputs) if hasattr(t, "shape")],
            params=[TensorInfo(n, tuple(p.shape), dt(p)) for n, p in model.named_parameters()],
            outputs=[TensorInfo("out" if len(outs) == 1 else f"out{i}", tuple(o.shape), dt(o)) for i, o in enumerate(outs)],
        )

    def source(self) -> str:
        return self._text

    def build_model(self, device: str = "cpu", seed: int = 0) -> Any:
        import torch

        torch.manual_seed(seed)
        with torch.device(device):
            return self.module.Model(*self.module.get_init_inputs())

    def make_inputs(self, device: str, seed: int = 0) -> list[Any]:
        import torch

        torch.manual_seed(seed)
        with torch.device(device):
            return list(self.module.get_inputs())


def load(path: str | Path) -> KBProblem:
    return KBProblem(path)
