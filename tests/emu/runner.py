"""The emulator's API for the tests: it lives in the package (``kerngen.harness.emu.runner``, which
``kerngen check --emulate`` uses too); this name is kept for the test modules that import it."""

from kerngen.harness.emu.runner import EmuError, available, emulate, run_plan  # noqa: F401
