"""The playbook's scan: cumulative sums/products along a dim."""
