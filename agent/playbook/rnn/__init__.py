"""The playbook's recurrent layers: nn.LSTM (an input-projection GEMM per layer, then a persistent recurrence)."""
