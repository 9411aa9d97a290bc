"""The playbook's pool: max/avg pooling windows (1-3 d)."""
