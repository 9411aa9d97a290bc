"""kerngen.harness.tune."""
