"""Numbers of the project's import graph: modules, internal import edges (and how many sit inside
functions), import cycles (strongly connected components of more than one module) and the largest
modules. A developer's measuring tool, run from the repository root: `python3 scripts/import_graph.py`.

Modules are named by their import path under the `kerngen` package, using the folder mapping of
pyproject.toml (harness/ -> kerngen.harness, ...)."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    cfg = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = cfg.get("package-dir", {})
    out: dict[str, Path] = {}
    for pkg in cfg["packages"]:
        folder = root / dirs.get(pkg, pkg.replace(".", "/"))
        for f in folder.glob("*.py"):
            name = pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"
            out[name] = f
    return out


def resolve(name: str, level: int, current: str, is_pkg: bool) -> str:
    if level == 0:
        return name
    base = current.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def edges(mods: dict[str, Path]) -> list[tuple[str, str, bool]]:
    out = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        is_pkg = path.stem == "__init__"
        top_level = {id(n) for n in tree.body}
        guarded = {id(n) for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(node.module or "", node.level, mod, is_pkg)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    out.append((mod, t, id(node) not in top_level))
        del guarded
    return out


def cycles(mods: dict[str, Path], es: list[tuple[str, str, bool]]) -> list[list[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for a, b, _ in es:
        graph[a].add(b)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    mods = modules(root)
    es = sorted(set(edges(mods)))
    pairs = {(a, b) for a, b, _ in es}
    inside = {(a, b) for a, b, f in es if f} - {(a, b) for a, b, f in es if not f}
    cyc = cycles(mods, es)
    sizes = sorted(((len(p.read_text().splitlines()), m) for m, p in mods.items()), reverse=True)
    print(f"modules {len(mods)}; internal import edges {len(pairs)}; only inside functions {len(inside)} "
          f"({100 * len(inside) / max(1, len(pairs)):.0f}%)")
    print(f"cycles {len(cyc)}: " + "; ".join(" <-> ".join(c) for c in cyc))
    print(f"modules over 500 lines {sum(1 for n, _ in sizes if n > 500)}: "
          + ", ".join(f"{m} {n}" for n, m in sizes if n > 500))


if __name__ == "__main__":
    main()
