"""Playbook family (registry): being built. ``FAMILY`` is None until then."""

from __future__ import annotations

from kerngen.agent.playbook.family import Family

FAMILY: Family | None = None
