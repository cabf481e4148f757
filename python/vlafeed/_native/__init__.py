"""vlafeed._native: the CPython binding of the C engine.

The C sources of the binding live in this folder (``_native.c`` holds module
start-up and the error mapping, one ``py_<layer>.c`` per engine layer); they
compile to the extension ``vlafeed._native._core``. This package re-exports
every name of that extension, so the rest of vlafeed (and user code that
reached for ``vlafeed._native.Loader`` and friends) keeps one import path.

Nothing here is public API: the classes and functions users call are in
``vlafeed.data``, ``vlafeed.torch``, ``vlafeed.ray`` and the top-level
``vlafeed`` package.
"""
from vlafeed._native import _core  # noqa: F401  (vlafeed._native._core, for its __file__)
from vlafeed._native._core import *  # noqa: F401,F403  (the extension's public names)
from vlafeed._native._core import __version__  # noqa: F401
