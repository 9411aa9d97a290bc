"""What some CPU tests need beyond the project, found in ONE place: the KernelBench copy beside the
project (``<repo>/../shared/kernelbench``; a worktree ``/work/wt/NAME`` reaches it the same way) and
a C++ compiler for the CPU emulator. Tests mark themselves ``@pytest.mark.needs_kernelbench`` /
``@pytest.mark.needs_cxx`` (tests/conftest.py skips them where the thing is missing, and fails them
instead when ``KERNGEN_REQUIRE_ALL=1``, as CI sets it: nothing vanishes silently there)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
# beside the project (a developer's checkout, CI), else inside it (a copy of the tree sent to a GPU host
# carries its own shared/), or where KERNGEN_KERNELBENCH points
_PLACES = [Path(p) for p in (os.environ.get("KERNGEN_KERNELBENCH", ""),) if p]
_PLACES += [ROOT.parent / "shared" / "kernelbench", ROOT / "shared" / "kernelbench"]
KERNELBENCH = next((p for p in _PLACES if (p / "level1").is_dir()), _PLACES[0])
REQUIRE_ALL = os.environ.get("KERNGEN_REQUIRE_ALL", "") not in ("", "0")


def kernelbench(*parts: str) -> Path:
    """A path inside the KernelBench copy (it may not exist: mark the test ``needs_kernelbench``)."""
    return KERNELBENCH.joinpath(*parts)


def kernelbench_missing() -> str:
    """Why the KernelBench copy is missing, or ''."""
    if (KERNELBENCH / "level1").is_dir() and (KERNELBENCH / "level2").is_dir():
        return ""
    return f"no KernelBench copy beside the project ({KERNELBENCH})"


def cxx_missing() -> str:
    """Why the CPU emulator cannot run here, or ''."""
    from kerngen.harness.emu.runner import available, compiler

    return "" if available() else f"no C++ compiler for the CPU emulator ({compiler()!r} is not on PATH)"


# problems/models at a test size: each (what the file says, what the test's copy says) occurs once in the file
_TINY = {
    "tiny_gpt": ("gpt_block", (("return [torch.randn(8, 1024, 768)]", "return [torch.randn(2, 8, 32)]"),
                               ("return [768, 12, 3072]", "return [32, 2, 64]"))),
    "tiny_lstm": ("lstm", (("return [torch.randn(64, 64, 256)]", "return [torch.randn(4, 5, 8)]"),
                           ("return [256, 512, 2, 10]", "return [8, 16, 1, 4]"))),
    "tiny_mlp": ("mlp", (("return [torch.randn(1024, 4096)]", "return [torch.randn(4, 16)]"),
                         ("return [4096, 4096, 1024]", "return [16, 16, 8]"))),
    "tiny_resnet_block": ("resnet_block", (("return [torch.randn(32, 64, 56, 56)]", "return [torch.randn(1, 8, 6, 6)]"),
                                           ("return [64]", "return [8]"))),
    "tiny_resnet18": ("resnet18", (("return [torch.randn(16, 3, 224, 224)]", "return [torch.randn(1, 3, 32, 32)]"),
                                   ("return [1000]", "return [10]"))),
    "tiny_vgg_stack": ("vgg_stack", (("return [torch.randn(16, 3, 112, 112)]", "return [torch.randn(1, 3, 8, 8)]"),)),
    "tiny_mobilenetv2_block": ("mobilenetv2_block", (("return [torch.randn(32, 32, 56, 56)]",
                                                      "return [torch.randn(1, 8, 6, 6)]"),
                                                     ("return [32, 6]", "return [8, 2]"))),
    "tiny_vit_block": ("vit_block", (("return [torch.randn(32, 197, 768)]", "return [torch.randn(2, 5, 32)]"),
                                     ("return [768, 12, 3072]", "return [32, 2, 64]"))),
}
TINY_MODELS = {name: model for name, (model, _) in sorted(_TINY.items())}  # one per file of problems/models
_TINY_DIR: list[Path] = []


def tiny_model(name: str) -> Path:
    """``tests``' copy of a whole model of ``problems/models`` at a size the emulator runs in seconds: the same
    forward, its inputs and constructor arguments replaced (``tiny_gpt``, ``tiny_lstm``), written once per process."""
    import tempfile

    if not _TINY_DIR:
        _TINY_DIR.append(Path(tempfile.mkdtemp(prefix="kerngen-tiny-models-")))
    path = _TINY_DIR[0] / f"{name}.py"
    if not path.exists():
        model, swaps = _TINY[name]
        text = (ROOT / "problems" / "models" / f"{model}.py").read_text()
        for old, new in swaps:
            assert text.count(old) == 1, f"problems/models/{model}.py no longer says {old!r} once"
            text = text.replace(old, new)
        path.write_text(text)
    return path


def script(path: str, name: str) -> ModuleType:
    """A developer's script (``scripts/<path>``, not a package module) loaded as module ``name``, for its tests."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
