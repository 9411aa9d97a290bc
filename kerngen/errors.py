"""Errors that reach the user as one clear line (the CLI prints ``str(err)`` and exits 2)."""

from __future__ import annotations


class KerngenError(Exception):
    """Base of every error the CLI turns into a one-line message and exit code 2."""

    exit_code = 2


class ProblemError(KerngenError):
    """A problem (built-in name or KernelBench file) cannot be found, loaded or run."""


class SpecError(KerngenError):
    """A kernel spec is malformed or does not fit the problem it is bound to."""


class ExprError(SpecError):
    """An arithmetic expression in a spec cannot be parsed or evaluated."""


class NoGPUError(KerngenError):
    """The command needs a CUDA device and none is visible."""


class CompileError(KerngenError):
    """NVRTC rejected the source. ``log`` carries the full compiler log for the agent."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class JournalError(KerngenError):
    """A run folder or its journal is missing, corrupt or truncated beyond use."""


class LLMError(KerngenError):
    """The LLM endpoint failed in a way that retrying cannot fix (auth, bad request, ...)."""
