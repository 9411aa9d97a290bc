"""The built-in suite of problems (KernelBench format, parameterised by shape and dtype)."""
