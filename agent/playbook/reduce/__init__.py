"""The playbook's reduce: sums, means, max/min/argmax, norms over any dims."""
