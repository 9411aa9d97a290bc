"""The one exception of the playbook's recognisers (families, chains): the playbook has nothing
for a problem."""

from __future__ import annotations

__all__ = ["NotCovered"]


class NotCovered(Exception):
    """The playbook has nothing for this problem; ``str()`` says why."""
