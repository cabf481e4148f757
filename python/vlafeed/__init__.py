"""vlafeed: stream LeRobot datasets into PyTorch training from a C engine.

The engine is C (the ``vlafeed._native`` extension); this package is a thin
layer over it.
"""
from vlafeed._native import __version__, VlafeedError  # noqa: F401

__all__ = ["__version__", "VlafeedError"]
