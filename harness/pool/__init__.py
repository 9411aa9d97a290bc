"""kerngen.harness.pool.local."""
