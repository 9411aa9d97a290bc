"""The ``kerngen`` command line: :mod:`kerngen.cli.app` (the app, its commands, ``main``), one
module per command group, :mod:`kerngen.cli.guard` (the one error guard) and
:mod:`kerngen.cli.compose` (the composition root: evaluator, proposer, tuner).

:func:`main` is the console script: it imports the app inside a Ctrl-C handler, so that an
interrupt in the first fraction of a second (the app still being imported) ends as one during a
command does, with one word and exit 130, never a traceback. An interrupt can also surface as
another exception (a ``KeyboardInterrupt`` raised inside pydantic-core while it builds a model's
validator comes out as a ``SchemaError``): whatever escapes after Ctrl-C is the interrupt."""

import signal
import sys

_interrupted = False


def _on_sigint(signum, frame):  # noqa: ARG001 - the signal module's signature
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def _interrupted_exit() -> None:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None


def main() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where a host set its own
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        from kerngen.cli.app import main as run_app  # here: within the handler

        run_app()
    except SystemExit:
        raise
    except BaseException:
        if _interrupted:
            _interrupted_exit()
        raise
