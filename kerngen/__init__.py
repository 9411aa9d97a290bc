"""kerngen: an LLM-driven agent writes CUDA-C kernels for a PyTorch op at a given shape; a
harness proves them correct and fast on a real GPU.

Folders of the repository map onto subpackages: ``harness/`` -> ``kerngen.harness``,
``agent/`` -> ``kerngen.agent``, ``problems/`` -> ``kerngen.problems``,
``prompts/`` -> ``kerngen.prompts`` (templates as package data).
"""

from kerngen.version import __version__

__all__ = ["__version__", "load"]


def load(path, runs_dir="runs", *, fallback=None, strict=False, check_new_shapes=True, model=None):
    """The PyTorch op of an export folder or of a run's best kernel (see :mod:`kerngen.results.exported_op`).
    ``fallback``: the problem's model, for shapes no kernel admits; ``strict``: raise for those instead.
    A model run (``kerngen generate MODEL.py``): an ``nn.Module`` running its plan, the weights ``model``'s
    (:mod:`kerngen.results.model_run`)."""
    from kerngen.results.exported_op import load_op
    from kerngen.results.model_run import load_model_run, model_run_path

    if model_run_path(path, runs_dir) is not None:
        return load_model_run(path, runs_dir, model=model if model is not None else fallback)

    return load_op(path, runs_dir, fallback=fallback, strict=strict, check_new_shapes=check_new_shapes)
