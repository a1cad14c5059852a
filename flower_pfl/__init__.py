"""flower-pfl: personalized federated learning algorithms as Flower strategies and clients.

Layers, bottom up: ``algorithms`` (the papers' math), ``learning`` (models, data, training),
the federation core (config, catalog, registry, reliability, model store), the Flower
adapters (``strategies``, ``clients``, ``server_app``, ``client_app``), ``running`` and
``reporting``, and ``cli`` on top.

``strategies`` and ``clients`` are top-level folders of the source tree (one file per
algorithm) but are imported as ``flower_pfl.strategies`` and ``flower_pfl.clients`` only, so
an installed flower-pfl never collides with another project's ``strategies`` module: a
wheel installs them inside this package (pyproject's ``package-dir``); from a source tree
(a checkout, an editable install, a Flower app bundle) :class:`SiblingFolders` maps exactly
these two names to the folders beside this package -- nothing else of the tree becomes
part of the package, and nothing is imported until asked for.

From Python: ``flower_pfl.run(config, **overrides)`` runs one configuration and returns its
results (:mod:`flower_pfl.api`, docs/python-api.md); it and the names of :data:`API` are
looked up in :mod:`flower_pfl.api` on first use (module ``__getattr__``), so ``import
flower_pfl`` imports neither torch nor Flower.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path
from typing import Any

__version__ = "0.1.0"

#: the two subpackages that live beside this folder in a source tree
SIBLINGS = ("strategies", "clients")
#: what ``flower_pfl.<name>`` finds in :mod:`flower_pfl.api` (imported on first use)
API = ("run", "load_config", "RunResult", "RunFailed", "ConfigError", "PreflightError")


def __getattr__(name: str) -> Any:
    """``flower_pfl.run`` & co. (:data:`API`): imported from :mod:`flower_pfl.api` when first
    asked for, so importing the package stays light."""
    if name in API:
        from flower_pfl import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])


class SiblingFolders(importlib.abc.MetaPathFinder):
    """Finds ``flower_pfl.strategies`` and ``flower_pfl.clients`` in ``root``'s folders of
    those names (their modules are then found on the subpackage's own path)."""

    def __init__(self, root: Path) -> None:
        self.folders = {f"{__name__}.{name}": root / name for name in SIBLINGS}

    def find_spec(self, fullname, path=None, target=None):
        folder = self.folders.get(fullname)
        if folder is None or not (folder / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


def _install() -> None:
    here = Path(__file__).resolve().parent
    if (here / "strategies").is_dir():  # a wheel: the subpackages are inside
        return
    # First on the meta path: the folders beside *this* copy of the package win over an
    # editable install's mapping to another checkout.
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "SiblingFolders"]
    sys.meta_path.insert(0, SiblingFolders(here.parent))


_install()
