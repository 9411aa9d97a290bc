"""Problems: KernelBench-format files, the built-in suite, shapes and dtypes."""
