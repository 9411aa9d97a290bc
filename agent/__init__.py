"""The search: proposers (LLM, playbook, replay), the tree search, the journal."""
