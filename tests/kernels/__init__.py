"""Kernel specs used by the GPU tier: correct kernels (positive controls) and cheats."""
