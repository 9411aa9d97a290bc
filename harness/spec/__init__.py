"""kerngen.harness.spec.spec."""
