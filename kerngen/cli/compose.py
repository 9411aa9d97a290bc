"""Make the proposer (and the tuner) a ``kerngen generate`` asked for.

* ``llm``: :class:`kerngen.agent.llm.proposer.LLMProposer` over an OpenAI-compatible endpoint
  (``--model``, ``--base-url``, ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``); every call is reported
  to ``usage.on_call`` (the search journals it and counts calls and tokens).
* ``playbook``: the offline :class:`kerngen.agent.playbook.PlaybookProposer` (no network).
* ``scripted``: :class:`kerngen.agent.scripted.ScriptedProposer` (deterministic, for demos/tests).
* ``auto``: ``llm`` when a model is given or ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` is set,
  else ``playbook``.

Imports are lazy: each proposer lives in its own module.
"""

from __future__ import annotations

import os
from typing import Any

from kerngen.agent.budget import Usage
from kerngen.errors import KerngenError, LLMError
from kerngen.harness.results import EvalResult, GpuFacts
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.outcome import TuneOutcome
from kerngen.problems.ref import ProblemRef

KINDS = ("auto", "llm", "playbook", "scripted")


def resolve_kind(kind: str, model: str | None) -> str:
    if kind not in KINDS:
        raise KerngenError(f"unknown proposer {kind!r} (choose from {', '.join(KINDS)})")
    if kind != "auto":
        return kind
    if model or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return "llm"
    return "playbook"


def playbook_seed(problem: ProblemRef) -> Any | None:
    """The playbook's first kernel for ``problem`` (to seed an LLM's first round), or None."""
    from kerngen.agent.playbook import seed_specs
    from kerngen.problems.load import load_problem

    specs = seed_specs(load_problem(problem))
    return specs[0] if specs else None


def default_model() -> str | None:
    return os.environ.get("KERNGEN_MODEL") or os.environ.get("OPENAI_MODEL")


def make_proposer(kind: str, problem: ProblemRef, *, usage: Usage, model: str | None = None,
                  base_url: str | None = None, llm_knobs: dict[str, Any] | None = None) -> tuple[Any, str | None]:
    """(proposer, model name or None)."""
    kind = resolve_kind(kind, model)
    if kind == "scripted":
        from kerngen.agent.scripted import ScriptedProposer

        return ScriptedProposer(), None
    if kind == "playbook":
        from kerngen.agent.playbook import PlaybookProposer
        from kerngen.problems.load import load_problem

        proposer = PlaybookProposer(load_problem(problem))
        if proposer.match is None:
            raise KerngenError(f"the offline playbook has nothing for {problem.label()}: {proposer.reason}")
        return proposer, None
    model = model or default_model()
    if not model:
        raise LLMError("no model: pass --model (or set KERNGEN_MODEL)")
    from kerngen.agent.llm.client import LLMClient
    from kerngen.agent.llm.config import LLMConfig
    from kerngen.agent.llm.proposer import LLMProposer

    config = LLMConfig.from_env(model, base_url, **{k: v for k, v in (llm_knobs or {}).items() if v is not None})
    client = LLMClient(config)
    client.check()  # before any GPU work: an unreachable endpoint, a wrong key or an unknown model
    return LLMProposer(client, on_call=usage.on_call), model


# ----- the tuner, as the search calls it ----------------------------------------------------
def make_tuner(evaluator: Any, problem: ProblemRef, gpu: GpuFacts, *, max_evals: int = 60,
               minutes: float | None = 3.0) -> Any | None:
    """A ``(problem, spec, result) -> TuneOutcome | None`` over :func:`kerngen.harness.tune.tuner.tune`
    (a spec with one configuration has nothing to tune: None)."""
    from kerngen.harness.tune.cache import TuneCache
    from kerngen.harness.tune.tuner import tune
    from kerngen.problems.load import load_problem

    info = load_problem(problem).info
    cache = TuneCache()  # a resumed or repeated search reuses what was measured
    sizes, tensors = dict(info.sizes), info.tensor_facts()
    minutes_cap = minutes

    def run(ref: ProblemRef, spec: KernelSpec, result: EvalResult, minutes: float | None = None) -> TuneOutcome | None:
        """``minutes``: what the search has left of its wall-clock budget (tuning ends by then)."""
        if spec.space_size() <= 1:
            return None
        limits = [m for m in (minutes_cap, minutes) if m is not None]
        limit = min(limits) if limits else None
        if limit is not None and limit <= 0:
            return None
        res = tune(evaluator, ref, spec, sizes=sizes, tensors=tensors, gpu=gpu, max_evals=max_evals,
                   minutes=limit, cache=cache)
        return res.outcome()

    return run
