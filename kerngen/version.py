"""kerngen's version (one place: the package, the journal and exports read it)."""

__version__ = "0.1.0"
