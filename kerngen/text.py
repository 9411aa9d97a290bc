"""What every output of kerngen needs: one clean line (:func:`one_line`) and strict JSON
(:func:`strict_json`). Text from journals and models is made printable first (:mod:`kerngen.redact`)."""

from __future__ import annotations

import math
from typing import Any

from kerngen.redact import printable


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line, without control sequences (messages quote journal and model text)."""
    line = " ".join(printable(str(text)).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def strict_json(value: Any) -> Any:
    """A copy of a JSON-like value with inf/NaN as None (keys as strings), so that ``--json``
    prints strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def sane_count(value: Any) -> int:
    """A count read from untrusted data (an endpoint's token usage, a journal's record of it), or
    0 when it is not a sane one (not an int, a bool, negative, absurdly large)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**40 else 0
