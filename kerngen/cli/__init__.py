"""The ``kerngen`` command line: :mod:`kerngen.cli.app` (the app, its commands, ``main``), one
module per command group, :mod:`kerngen.cli.guard` (the one error guard) and
:mod:`kerngen.cli.compose` (the composition root: evaluator, proposer, tuner).

:func:`main` is the console script: it imports the app inside a Ctrl-C handler, so that an
interrupt in the first fraction of a second (the app still being imported) ends as one during a
command does, with one word and exit 130, never a traceback."""

import sys


def main() -> None:
    try:
        from kerngen.cli.app import main as run_app  # here: within the handler
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    run_app()
