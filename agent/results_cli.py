"""Placeholder: the owning change fills in this command module."""

import typer


def register(app: typer.Typer) -> None:
    return None
