"""Helpers shared by the GPU-tier test modules (each keeps its own module-scoped WorkerPool)."""

from __future__ import annotations

from typing import Iterable

from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.results import EvalResult

from .specs import CASES

# small and fast: 3 fresh input sets, a short timing budget, a per-candidate timeout
OPTIONS = EvalOptions(seeds=3, bench=True, budget_ms=20, timeout_s=20)


def describe(r: EvalResult) -> str:
    """Everything worth reading when an assertion on a result fails."""
    check = r.check
    lines = [f"verdict={r.verdict.value} worker={r.worker} message={r.message!r}"]
    if check is not None:
        lines.append(f"check.failed={check.failed and check.failed.value} check.message={check.message!r} "
                     f"seeds={check.seeds} atol={check.atol} rtol={check.rtol} rel_err={check.rel_err:.3g}")
    if r.timing is not None:
        lines.append(f"timing: median {r.timing.median_ms:.4f} ms, reps {r.timing.reps}")
    if r.log:
        lines.append("log tail:\n" + r.log[-1500:])
    return "\n".join(lines)


class Batches:
    """Evaluates all named cases of one problem in a single ``evaluate`` call (compiled in
    parallel, run back to back) the first time any of them is asked for; then serves results.

    ``evaluate`` must return one result per candidate. If it does not (a harness bug), the
    batch is retried one candidate at a time so each test still reports its own cheat, and the
    test that asked first fails on the short batch."""

    def __init__(self, pool, names: Iterable[str], options: EvalOptions = OPTIONS) -> None:
        self.pool, self.names, self.options = pool, list(names), options
        self.results: dict[str, EvalResult | None] = {}

    def _evaluate(self, problem, names: list[str]) -> list[EvalResult]:
        return self.pool.evaluate(problem, [Candidate(spec=CASES[n].spec) for n in names], self.options)

    def __getitem__(self, name: str) -> EvalResult:
        if name not in self.results:
            problem = CASES[name].problem
            group = [n for n in self.names if CASES[n].problem == problem and n not in self.results]
            if name not in group:
                group.append(name)
            out = self._evaluate(problem, group)
            if len(out) == len(group):
                self.results.update(zip(group, out))
            else:
                for n in group:
                    one = self._evaluate(problem, [n])
                    self.results[n] = one[0] if len(one) == 1 else None
                raise AssertionError(f"evaluate returned {len(out)} results for {len(group)} candidates")
        r = self.results[name]
        assert r is not None, f"evaluate returned no result for {name} (evaluated alone)"
        return r
