"""kerngen.harness.compile.compiler."""
