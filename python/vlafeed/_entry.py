"""'package.module:name' specs (a user's tokenizer, augmentation, policy factory): the object they name."""
from __future__ import annotations

import importlib


def import_entry(spec: str):
    """The object `spec` ('package.module:name') names. ImportError or AttributeError as importlib and getattr
    raise them: each caller words the error for its own key."""
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)
