"""A CPU emulator of CUDA-C kernel specs (g++, one fiber per CUDA thread), run in a jail: README.md."""
