"""The ``kerngen`` command: one typer app, every command named here (:data:`COMMANDS`), each
behind the one error guard (:func:`kerngen.cli.guard.guard`) and the Ctrl-C handler. A command
group is a module of this package; the parts a command needs are built in :mod:`kerngen.cli.compose`.

A command's module is imported when that command runs or shows its help (:class:`_LazyGroup`):
``kerngen --help`` and ``--version`` import none of them, and no command imports torch before it
needs it (tests/cli/test_startup.py)."""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from kerngen.errors import KerngenError
from kerngen.redact import redact
from kerngen.cli.guard import error_line, guard
from kerngen.harness.compile.sandbox import ALLOW_UNCONFINED_ENV
from kerngen.text import one_line


class _NoBoolMetavar:
    """A flag takes no value: typer's rich help would print ``<bool>`` beside it."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            if getattr(p, "is_flag", False) and p.metavar is None:
                p.metavar = ""
        return params


class _Command(_NoBoolMetavar, TyperCommand):
    pass


class _LazyCommands(Mapping[str, Any]):
    """The click commands of :data:`COMMANDS`, each built (its module imported) on first access."""

    def __init__(self) -> None:
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in COMMANDS:
            raise KeyError(name)
        if name not in self._built:
            self._built[name] = _build(name)
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class _LazyGroup(_NoBoolMetavar, TyperGroup):
    """The root group: its commands are built on first use; its help lists them from
    :data:`COMMANDS` (name and summary) without importing any."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _LazyCommands()  # type: ignore[assignment]
        self._listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if self._listing and cmd_name in COMMANDS:  # the root help's row: name and summary only
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].summary)
        return self.commands.get(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="kerngen",
    cls=_LazyGroup,
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
              "kerngen bench conv2d --kernel conv.json --config TW=16,TH=8",
              "kerngen bench path/to/23_Softmax.py --solution my_solution.py   (your ModelNew: your own Python)"),
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
                 "kerngen playbook softmax --json", "kerngen playbook path/to/KernelBench/level2"),
    "spec": ("kerngen spec", "kerngen spec --schema > kernel-spec.schema.json"),
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


@dataclass(frozen=True)
class Command:
    """A command of :data:`COMMANDS`: where its function lives (``module:function`` in this
    package), the summary the root help lists, and whether it reads folders someone may have handed
    over (then any error, not only a KerngenError, is one line and exit 2, never a traceback)."""

    where: str
    summary: str
    data: bool = False


COMMANDS: dict[str, Command] = {
    "problems": Command("problems:problems", "List the built-in problems, or describe problems: tensors, sizes, "
                        "FLOPs, bytes, tolerance."),
    "bench": Command("bench:bench", "Time PyTorch eager, torch.compile and a kernel spec (or your own KernelBench "
                     "ModelNew) on this GPU."),
    "calibrate": Command("bench:calibrate", "Measure the harness on this GPU: overhead per candidate, spread of a "
                         "median, agreement with triton.testing.do_bench."),
    "check": Command("check:check_cmd", "Vet a kernel spec without a GPU: plan, sandboxed compile, arguments, "
                     "registers, admissible configurations."),
    "tune": Command("tune:tune_cmd", "Autotune a kernel spec's tunables on this machine's GPUs, or a Ray "
                    "cluster's (every config fully checked)."),
    "generate": Command("search:generate", "Search for a fast CUDA-C kernel of PROBLEM (or of every file of a "
                        "folder); journal it under runs/<id>/."),
    "show": Command("search:show", "Print the search tree of a run: ideas, categories, verdicts, times, speedups, "
                    "registers.", data=True),
    "runs": Command("search:runs", "List the runs under --runs-dir: problem, GPU, best ms, speedups, status.",
                    data=True),
    "replay": Command("search:replay", "Re-run a recorded search with no LLM call, re-evaluating every node on "
                      "this GPU.", data=True),
    "suite": Command("results:suite", "The best kernel of each problem vs PyTorch eager and torch.compile on this "
                     "GPU, fast_p vs both.", data=True),
    "report": Command("results:report", "Write one self-contained HTML report of a run (tree of ideas, charts, "
                      "configuration).", data=True),
    "export": Command("results:export", "Export the best kernel of a run: .cu, launch plan + config (JSON), cubin "
                      "and a PyTorch op module.", data=True),
    "spec": Command("spec:spec_cmd", "What a kernel spec is: its fields, or its JSON schema (--schema)."),
    "playbook": Command("playbook:playbook", "The offline playbook's family, variants and ideas for PROBLEM; a "
                        "variant's spec; a folder's coverage."),
}


def command_function(name: str) -> Callable[..., Any]:
    """The function of command ``name`` (its module imported now)."""
    module, _, function = COMMANDS[name].where.partition(":")
    return getattr(importlib.import_module(f"kerngen.cli.{module}"), function)


def _build(name: str) -> Any:
    """The click command ``name``: its function behind the guard and the Ctrl-C handler."""
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    fn = _interruptible(guard(command_function(name), data=COMMANDS[name].data))
    one.command(name, cls=_Command, epilog=_epilog(EXAMPLES[name]))(fn)
    return typer.main.get_command(one)


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
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        _configure_logging()
        app()
    except KerngenError as exc:
        error_line(one_line(str(exc)))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # before a command runs (a command's own Ctrl-C: _interruptible)
        err.print("interrupted", markup=False)
        sys.exit(130)
