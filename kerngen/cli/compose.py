"""The composition root: the evaluator, the proposer, the tuner and the proposer's context a
command asked for (``kerngen generate``, ``replay``, ``suite``, ``tune``).

Evaluators (``--evaluator``, hidden): ``pool`` (the GPUs: :class:`kerngen.harness.pool.local.WorkerPool`,
or with ``--ray`` :class:`kerngen.harness.pool.ray_pool.RayPool`, those of a Ray cluster)
or ``scripted`` (:class:`kerngen.agent.scripted.ScriptedEvaluator`: deterministic, no GPU,
made-up times); ``dry-run`` (``--dry-run``: :class:`kerngen.harness.pool.dry_run.DryRunEvaluator`,
real compiles for a preset GPU, nothing run). Proposers:

* ``llm``: :class:`kerngen.agent.llm.proposer.LLMProposer` over an OpenAI-compatible endpoint
  (``--model``, ``--base-url``, ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``); every call is reported
  to ``usage.on_call`` (the search journals it and counts calls and tokens).
* ``playbook``: the offline :class:`kerngen.agent.playbook.PlaybookProposer` (no network).
* ``scripted``: :class:`kerngen.agent.scripted.ScriptedProposer` (deterministic, for demos/tests).
* ``auto``: ``llm`` when a model is given or ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` is set,
  else ``playbook``.

The tuner a search calls follows :class:`kerngen.agent.search_settings.Tuner`. Only the LLM
proposer is imported where it is made (its HTTP client would slow every ``kerngen --help``).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from kerngen.agent.budget import Usage
from kerngen.agent.context import default_context, minimal_context
from kerngen.agent.playbook import PlaybookProposer, seed_specs
from kerngen.agent.proposer import SearchContext
from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer, ScriptedTuner
from kerngen.agent.search_settings import ContextFactory, Tuner
from kerngen.errors import KerngenError, LLMError
from kerngen.redact import register_url
from kerngen.harness.pool import local as pool
from kerngen.harness.pool.dry_run import DryRunEvaluator
from kerngen.harness.results import Baseline, EvalResult, GpuFacts
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.cache import TuneCache
from kerngen.harness.tune.outcome import TuneOutcome
from kerngen.harness.tune import tuner as tuning
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef

KINDS = ("auto", "llm", "playbook", "scripted")
EVALUATORS = ("pool", "scripted", "dry-run")


# ----- the evaluator and what the proposer is told -------------------------------------------
def make_evaluator(kind: str, *, gpu: str = "h100", ray: str | None = None, ray_gpu_model: str | None = None,
                   **pool_options: Any) -> Any:
    """The evaluator ``--evaluator`` names; ``pool_options`` go to the WorkerPool (e.g.
    ``timeout_s``). The pool raises NoGPUError where no GPU is visible. ``dry-run``
    (``--dry-run``): compiles for the preset ``gpu``, runs nothing. ``ray`` (``--ray``, only for
    the pool: the other evaluators use no GPU): the GPUs of the Ray cluster at that address,
    ``ray_gpu_model`` those of one model."""
    if kind == "scripted":
        return ScriptedEvaluator()
    if kind == "dry-run":
        return DryRunEvaluator(gpu)
    if kind != "pool":
        raise KerngenError(f"unknown evaluator {kind!r} (choose from {', '.join(EVALUATORS)})")
    if ray_gpu_model and not ray:
        raise KerngenError("--ray-gpu-model picks the GPUs of a Ray cluster: give --ray ADDRESS too")
    if ray:
        return _ray_pool().RayPool(ray, gpu_model=ray_gpu_model, **pool_options)
    return pool.WorkerPool(**pool_options)


def _ray_pool() -> ModuleType:
    """The Ray evaluator's module. Imported here, where --ray is used, and not at the top: Ray is
    an optional extra (a large install and a slow import) that the default install lacks."""
    try:
        from kerngen.harness.pool import ray_pool
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "ray":
            raise
        raise KerngenError("--ray needs Ray on this machine: pip install 'kerngen[ray]'") from None
    return ray_pool


def shards(evaluator: Any) -> list[Any]:
    """The evaluators a batch runs its problems on side by side: one per GPU worker of a pool
    (:meth:`~kerngen.harness.pool.local.WorkerPool.shards`), else the evaluator itself."""
    split = getattr(evaluator, "shards", None)
    return split() if split is not None else [evaluator]


def make_context_factory(evaluator_kind: str) -> ContextFactory:
    """What the proposer is told of the problem and GPU; the scripted demo needs no problem
    module (it runs on any name), but uses it if it loads."""
    if evaluator_kind != "scripted":
        return default_context

    def ctx(problem: ProblemRef, gpu: GpuFacts, baseline: Baseline | None) -> SearchContext:
        try:
            return default_context(problem, gpu, baseline)
        except KerngenError:
            return minimal_context(problem, gpu, baseline)

    return ctx


def make_search_tuner(evaluator_kind: str, evaluator: Any, problem: ProblemRef, no_tune: bool) -> Tuner | None:
    """The tuner of a search's survivors (None: ``--no-tune``)."""
    if no_tune or evaluator_kind == "dry-run":  # a dry run has no correct kernel to tune
        return None
    if evaluator_kind == "scripted":
        return ScriptedTuner(evaluator)
    return make_tuner(evaluator, problem, evaluator.gpu_facts())


# ----- the proposer -------------------------------------------------------------------------


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
    specs = seed_specs(load_problem(problem))
    return specs[0] if specs else None


def default_model() -> str | None:
    return os.environ.get("KERNGEN_MODEL") or os.environ.get("OPENAI_MODEL")


def make_proposer(kind: str, problem: ProblemRef, *, usage: Usage, model: str | None = None,
                  base_url: str | None = None, llm_knobs: dict[str, Any] | None = None) -> tuple[Any, str | None]:
    """(proposer, model name or None)."""
    kind = resolve_kind(kind, model)
    if kind == "scripted":
        return ScriptedProposer(), None
    if kind == "playbook":
        proposer = PlaybookProposer(load_problem(problem))
        if proposer.match is None:
            raise KerngenError(f"the offline playbook has nothing for {problem.label()}: {proposer.reason}")
        return proposer, None
    model = model or default_model()
    if not model:
        raise LLMError("no model: pass --model (or set KERNGEN_MODEL)")
    # here, not at the top: the HTTP client (openai) would be imported by every `kerngen --help`
    from kerngen.agent.llm.client import LLMClient
    from kerngen.agent.llm.config import LLMConfig
    from kerngen.agent.llm.proposer import LLMProposer

    register_url(base_url)  # a password in --base-url is redacted from every journal, report, log and error
    config = LLMConfig.from_env(model, base_url, **{k: v for k, v in (llm_knobs or {}).items() if v is not None})
    register_url(str(config.base_url or ""))  # ... and one from the environment
    if config.has_prices and usage.cost_usd is None:
        usage.cost_usd = 0.0  # priced: a search that spent nothing says $0, not "no prices"
    client = LLMClient(config)
    client.check()  # before any GPU work (journaled once the run exists, counted in requests and cost)
    return LLMProposer(client, on_call=usage.on_call), model


# ----- the tuner, as the search calls it ----------------------------------------------------
def make_tuner(evaluator: Any, problem: ProblemRef, gpu: GpuFacts, *, max_evals: int = 60,
               minutes: float | None = 3.0) -> Tuner:
    """A :class:`~kerngen.agent.search_settings.Tuner` over :func:`kerngen.harness.tune.tuner.tune`
    (a spec with one configuration has nothing to tune: None), at most ``minutes`` per node."""
    info = load_problem(problem).info
    cache = TuneCache()  # a resumed or repeated search reuses what was measured
    sizes, tensors = dict(info.sizes), info.tensor_facts()
    minutes_cap = minutes

    def run(ref: ProblemRef, spec: KernelSpec, result: EvalResult, *, minutes: float | None) -> TuneOutcome | None:
        """``minutes``: what the search has left of its wall-clock budget (tuning ends by then)."""
        if spec.space_size() <= 1:
            return None
        limits = [m for m in (minutes_cap, minutes) if m is not None]
        limit = min(limits) if limits else None
        if limit is not None and limit <= 0:
            return None
        res = tuning.tune(evaluator, ref, spec, sizes=sizes, tensors=tensors, gpu=gpu, max_evals=max_evals,
                          minutes=limit, cache=cache)
        return res.outcome()

    return run
