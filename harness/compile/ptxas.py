"""Parse the ``--ptxas-options=-v`` report that NVRTC appends to its log.

What ptxas 13.0 writes, per entry function::

    ptxas info    : Compiling entry function 'k' for 'sm_90'
    ptxas info    : Function properties for k
    ptxas         .     1040 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 40 registers, used 0 barriers, 256 bytes smem, 1040 bytes cumulative stack size
    ptxas info    : Compile time = 44.054 ms

Older releases also print ``N bytes cmem[0]`` (and ``cmem[2]`` ...) on the ``Used`` line; every
``cmem[i]`` is summed into ``const_bytes``. ``Function properties`` blocks of non-entry device
functions (``__internal_accurate_pow`` ...) are read but not reported as kernels.
"""

from __future__ import annotations

import re

from kerngen.harness.results import KernelResources

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_CUMULATIVE = re.compile(r"(\d+) bytes cumulative stack size")


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    """Kernel name -> resources, for every entry function in the log (in the log's order)."""
    entries: dict[str, dict[str, int]] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    current: str | None = None  # the entry whose "Used ..." line comes next
    props: str | None = None  # the function whose "stack frame" line comes next
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            entries.setdefault(current, {})
            continue
        if m := _PROPS.search(line):
            props = m.group(1)
            continue
        if m := _STACK.search(line):
            if props is not None:
                frames[props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            props = None
            continue
        if (m := _USED.search(line)) and current is not None:
            e = entries[current]
            e["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                e["shared_bytes"] = int(s.group(1))
            e["const_bytes"] = sum(int(c) for c in _CMEM.findall(line))
            if c := _CUMULATIVE.search(line):
                e["cumulative_stack"] = int(c.group(1))
            current = None
    out: dict[str, KernelResources] = {}
    for name, e in entries.items():
        stack, spill_st, spill_ld = frames.get(name, (0, 0, 0))
        out[name] = KernelResources(
            registers=e.get("registers", 0),
            spill_stores=spill_st,
            spill_loads=spill_ld,
            shared_bytes=e.get("shared_bytes", 0),
            stack_bytes=max(stack, e.get("cumulative_stack", 0)),
            const_bytes=e.get("const_bytes", 0),
        )
    return out
