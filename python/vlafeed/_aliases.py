"""Old module paths kept importable after the package was laid out by concept.

``import vlafeed.loader`` (and the others in ``MOVED``) gives the very module
object now at its new path, so code that imports, reads or monkeypatches the
old name sees the same functions and state as the new one. Installed by
``vlafeed/__init__.py``; nothing is imported until an old name is asked for.
"""
import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "vlafeed.dataset": "vlafeed.data.dataset",
    "vlafeed.loader": "vlafeed.data.loader",
    "vlafeed.mix": "vlafeed.data.mix",
    "vlafeed.wds": "vlafeed.data.wds",
    "vlafeed.plan": "vlafeed.data.plan",
    "vlafeed.lerobot_compat": "vlafeed.data.lerobot_compat",
    "vlafeed.wds_torch": "vlafeed.torch.wds",
    "vlafeed.ray_wds": "vlafeed.ray.wds",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old name in ``MOVED`` to the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module):
        # The import system set the module's __spec__ to the alias's; give it back its own.
        module.__spec__ = self._real_spec


def install():
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
