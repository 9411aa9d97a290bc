"""The playbook's conv: conv2d (direct, implicit GEMM, 3xTF32), conv+relu+maxpool, conv with a fused epilogue, N-d and transposed convs, a conv with a reduction/norm/pool tail."""
