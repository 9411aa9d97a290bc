"""The ``kerngen`` command line: :mod:`kerngen.cli.app` (the app, its commands, ``main``), one
module per command group, :mod:`kerngen.cli.guard` (the one error guard) and
:mod:`kerngen.cli.compose` (the composition root: evaluator, proposer, tuner)."""
