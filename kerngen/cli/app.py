"""The ``kerngen`` command: one typer app, every command registered here (:data:`COMMANDS`), each
behind the one error guard (:func:`kerngen.cli.guard.guard`) and the Ctrl-C handler. A command
group is a module of this package; the parts a command needs are built in :mod:`kerngen.cli.compose`.
torch and cupy are imported where they are used, deep in the harness, so ``--help`` stays quick."""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any, Callable, Optional

import typer
from rich.console import Console

from kerngen.errors import KerngenError
from kerngen.redact import redact
from kerngen.cli import bench, check, playbook, problems, results, search, tune
from kerngen.cli.guard import error_line, guard
from kerngen.harness.compile.sandbox import ALLOW_UNCONFINED_ENV
from kerngen.text import one_line

app = typer.Typer(
    name="kerngen",
    help="Generate, check and benchmark fast CUDA-C kernels for PyTorch ops.\n\n"
         "RUN, wherever a command takes one, is a run folder, a run id under --runs-dir, or 'latest' (the newest "
         "run there). Start with: kerngen problems; kerngen generate softmax; kerngen runs; kerngen show latest. "
         "kerngen COMMAND -h shows a command's options and examples.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
)


def _version(value: bool) -> None:
    if value:
        from kerngen import __version__

        typer.echo(f"kerngen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", "-V", callback=_version, is_eager=True,
                                           help="print kerngen's version and exit"),
    allow_unconfined_compile: bool = typer.Option(
        False, "--allow-unconfined-compile",
        help="compile even where the kernel can confine no compile process (no Landlock, no seccomp): "
             "model-written source could then make NVRTC read host files past the source policy"),
) -> None:
    """kerngen's options (the app's help text is the one shown)."""
    if allow_unconfined_compile:  # read where the compile workers start (harness/compile/sandbox.py)
        os.environ[ALLOW_UNCONFINED_ENV] = "1"


# command -> its "Examples:" (shown at the end of `kerngen COMMAND --help`)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "problems": ("kerngen problems", "kerngen problems softmax --shape 8192x1024 --dtype bf16",
                 "kerngen problems path/to/19_ReLU.py other.py --json"),
    "bench": ("kerngen bench softmax --shape 8192x1024 --dtype bf16",
              "kerngen bench conv2d --kernel my_conv.json --config TW=16,TH=8"),
    "calibrate": ("kerngen calibrate", "kerngen calibrate --repeats 10 --json"),
    "check": ("kerngen check my_conv.json conv2d --config TW=16", "kerngen check spec.json softmax --compile-all"),
    "tune": ("kerngen tune conv2d --kernel conv.json --strategy model --max-evals 200",),
    "generate": ("kerngen generate softmax", "kerngen generate rmsnorm --shape 4096x4096 --dtype bf16 --minutes 10",
                 "OPENAI_API_KEY=... kerngen generate problems/suite/layernorm.py --model gpt-5 --rounds 4",
                 "kerngen generate --resume latest",
                 "kerngen generate path/to/KernelBench/level1 --minutes 2   (one search per file; again: continues)"),
    "show": ("kerngen show latest", "kerngen show 20261123-023704-layernorm-d003 --json"),
    "runs": ("kerngen runs", "kerngen runs --runs-dir elsewhere/runs --json"),
    "replay": ("kerngen replay latest", "kerngen replay RUN --problem problems/suite/layernorm.py"),
    "suite": ("kerngen suite --runs runs", "kerngen suite softmax layernorm --json"),
    "report": ("kerngen report latest", "kerngen report RUN -o report.html"),
    "export": ("kerngen export latest --out exported/", "kerngen export RUN --out exported/ --name my_softmax"),
    "playbook": ("kerngen playbook conv2d", "kerngen playbook conv2d --variant igemm -o conv.json",
                 "kerngen playbook softmax --json"),
}


def _epilog(examples: tuple[str, ...]) -> str:
    return "\n".join(("Examples:", *(f"  {e}" for e in examples)))


def _interruptible(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Ctrl-C in any command: one line on stderr and exit 130 (typer alone exits silently).
    A command that says more (generate names the run to resume) raises typer.Exit(130) itself."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            Console(stderr=True, highlight=False).print("interrupted", markup=False)
            raise typer.Exit(130) from None

    return wrapper


# name -> (the command, whether it reads folders someone may have handed over: then any error,
# not only a KerngenError, is one line and exit 2, never a traceback)
COMMANDS: dict[str, tuple[Callable[..., Any], bool]] = {
    "problems": (problems.problems, False),
    "bench": (bench.bench, False),
    "calibrate": (bench.calibrate, False),
    "check": (check.check_cmd, False),
    "tune": (tune.tune_cmd, False),
    "generate": (search.generate, False),
    "show": (search.show, True),
    "runs": (search.runs, True),
    "replay": (search.replay, True),
    "suite": (results.suite, True),
    "report": (results.report, True),
    "export": (results.export, True),
    "playbook": (playbook.playbook, False),
}
for _name, (_fn, _data) in COMMANDS.items():
    app.command(_name, epilog=_epilog(EXAMPLES[_name]))(_interruptible(guard(_fn, data=_data)))


class _RedactingFormatter(logging.Formatter):
    """Log lines pass the same filter as journals: no key, no password of a URL."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def _configure_logging() -> None:
    """kerngen's own log lines (retries, torch.compile failures...) stay quiet unless asked for
    with KERNGEN_LOG_LEVEL=INFO|WARNING: the terminal shows results and one-line errors."""
    level = os.environ.get("KERNGEN_LOG_LEVEL", "ERROR").upper()
    logger = logging.getLogger("kerngen")
    logger.setLevel(getattr(logging, level, logging.ERROR))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


def main() -> None:
    _configure_logging()
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        app()
    except KerngenError as exc:
        error_line(one_line(str(exc)))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # before a command runs (a command's own Ctrl-C: _interruptible)
        err.print("interrupted", markup=False)
        sys.exit(130)
