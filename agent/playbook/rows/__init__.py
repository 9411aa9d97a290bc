"""The playbook's rows: softmax, layernorm and rmsnorm over the last dims (the row in registers, split or cooperative)."""
