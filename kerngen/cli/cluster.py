"""The options that put a command's evaluations on a Ray cluster (``generate``, ``tune``, ``suite``):
without them, the GPUs of this host. The evaluator they choose is made in
:func:`kerngen.cli.compose.make_evaluator`; docs/cluster.md says what a cluster run guarantees."""

from __future__ import annotations

import typer

RAY = typer.Option(
    None, "--ray", metavar="ADDRESS", envvar="KERNGEN_RAY_ADDRESS",
    help="evaluate on a Ray cluster, one actor per GPU: 'auto' (the cluster this machine is part of), "
         "'local' (start one on this machine) or the cluster's address (needs kerngen[ray])")
RAY_GPU_MODEL = typer.Option(
    None, "--ray-gpu-model", metavar="NAME", envvar="KERNGEN_RAY_GPU_MODEL",
    help="with --ray: time on the GPUs whose name contains NAME only (a cluster of several models needs it)")
