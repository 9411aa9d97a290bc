"""Run-time facts and the compile/check/bench harness."""
