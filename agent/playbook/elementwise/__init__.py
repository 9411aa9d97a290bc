"""The playbook's elementwise: pointwise chains over one tensor (16-byte vectors) or broadcast operands (a map)."""
