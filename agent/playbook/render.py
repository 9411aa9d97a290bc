"""The playbook's template renderer and the helpers every variant builder shares (tunable
lists in tuner order, spec assembly, shape products)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from kerngen.harness.spec.spec import KernelSpec


TEMPLATES = Path(__file__).parent / "templates"  # the shared headers; each family's own are in its folder's templates/
MAX_SMEM = 232448  # bytes of shared memory one block may have on sm_90 (227 KB)
COOP_NB = 128  # the cooperative layernorm's grid where the GPU has that many SMs (H100/H200: 132; see layernorm_coop)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(TEMPLATES), *sorted(str(d) for d in TEMPLATES.parent.glob("*/templates"))]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def render(template: str, **vars: object) -> str:
    return _env().get_template(template).render(**vars)


def vec_width(dtype: str) -> int:
    return 4 if dtype == "float32" else 8


def tunable(values: list[int], default: int) -> list[int]:
    """Tunable values in increasing order, ``default`` added when missing: the order is the
    tuner's notion of "one step away" (its local search and model walk it)."""
    return sorted({*values, default})


def make_spec(name: str, description: str, source: str, tunables: dict[str, list[int]], defaults: dict[str, int], **kw) -> KernelSpec:
    tun = {k: tunable(v, defaults.get(k, v[0])) for k, v in tunables.items()}
    return KernelSpec(name=name, description=description, source=source, tunables=tun,
                      defaults={k: defaults.get(k, v[0]) for k, v in tunables.items()}, **kw)


def pick(defaults: dict[str, int], base: dict[str, int]) -> dict[str, int]:
    merged = dict(base)
    merged.update({k: v for k, v in defaults.items() if k in base})
    return merged


def shape_prod(x: str, dims: range) -> str:
    return " * ".join(f"{x}.shape[{i}]" for i in dims) or "1"


def paren(e: object) -> str:
    """An expression parenthesised, to splice into a longer one."""
    return f"({e})"


def i32(value: object) -> dict[str, object]:
    """A launch's int32 scalar argument: a number, or an expression over the bound tensors."""
    return {"kind": "int32", "value": value if isinstance(value, int) else str(value)}


def three(t: tuple[int, ...], fill: int) -> tuple[int, int, int]:
    """A 1-D or 2-D per-dim tuple as 3-D (depth, height, width): the missing leading dims are ``fill``."""
    return (fill,) * (3 - len(t)) + tuple(t)  # type: ignore[return-value]
