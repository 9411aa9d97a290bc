"""kerngen.harness.gpu."""
