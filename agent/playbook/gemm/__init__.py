"""The playbook's gemm: fp32 matmul (SGEMM, 3xTF32), GEMMs with a fused epilogue, GEMMs with a row stage."""
