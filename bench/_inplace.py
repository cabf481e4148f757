"""Which vlafeed the bench scripts run: the in-place build (``make py-inplace``)
when this checkout has one, else the installed package (``make demo`` installs
it). A checkout without a built extension must not put its ``python/`` folder
on the path: that package cannot import without ``vlafeed/_native/_core*.so``.
"""
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "python"


def built():
    """True when the checkout's package has its extension built in place."""
    return any((SOURCE / "vlafeed" / "_native").glob("_core*.so"))


def use():
    """Import the in-place build in this process when there is one."""
    if built() and str(SOURCE) not in sys.path:
        sys.path.insert(0, str(SOURCE))


def child_env(base=None, **extra):
    """Environment for a child Python process: ``base`` (default os.environ) plus ``extra``, with the
    in-place build first on PYTHONPATH when there is one (else PYTHONPATH as it was)."""
    env = dict(os.environ if base is None else base, **extra)
    if built():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE), env.get("PYTHONPATH", "")) if p)
    return env
