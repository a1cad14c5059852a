"""flower-pfl: personalized federated learning algorithms as Flower strategies and clients.

Layers, bottom up: ``algorithms`` (the papers' math), ``learning`` (models, data, training),
the federation core (config, catalog, registry, reliability, model store), the Flower
adapters (``strategies``, ``clients``, ``server_app``, ``client_app``), ``running`` and
``reporting``, and ``cli`` on top.

``strategies`` and ``clients`` (one file per algorithm) are plain subpackages; the
top-level ``strategies/`` and ``clients/`` folders of a checkout are links to them, so every
tool (Python's import system, mypy, a wheel, a Flower app bundle) finds one copy under one
name, ``flower_pfl.strategies`` / ``flower_pfl.clients`` (docs/design.md).

From Python: ``flower_pfl.run(config, **overrides)`` runs one configuration and returns its
results (:mod:`flower_pfl.api`, docs/python-api.md); it and the names of :data:`API` are
looked up in :mod:`flower_pfl.api` on first use (module ``__getattr__``), so ``import
flower_pfl`` imports neither torch nor Flower.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

#: what ``flower_pfl.<name>`` finds in :mod:`flower_pfl.api` (imported on first use)
API = ("run", "load_config", "RunResult", "RunFailed", "ConfigError", "PreflightError")
#: the public names: what ``dir(flower_pfl)`` and ``from flower_pfl import *`` give (not
#: this module's helpers, nor the subpackages an import has loaded)
__all__ = [*API, "__version__"]


def __getattr__(name: str) -> Any:
    """``flower_pfl.run`` & co. (:data:`API`): imported from :mod:`flower_pfl.api` when first
    asked for, so importing the package stays light."""
    if name in API:
        from flower_pfl import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names only (:data:`__all__`)."""
    return sorted(__all__)
