"""flower-pfl: personalized federated learning algorithms as Flower strategies and clients.

Layers, bottom up: ``algorithms`` (the papers' math), ``learning`` (models, data, training),
the federation core (config, catalog, registry, reliability, model store), the Flower
adapters (``strategies``, ``clients``, ``server_app``, ``client_app``), ``running`` and
``reporting``, and ``cli`` on top.

``strategies`` and ``clients`` are top-level folders of the source tree (one file per
algorithm) but are imported as ``flower_pfl.strategies`` and ``flower_pfl.clients``, so an
installed flower-pfl never collides with another project's ``strategies`` module: a wheel
installs them inside this package (pyproject's ``package-dir``); from a source tree (a
checkout, an editable install, a Flower app bundle) the two folders beside this one are
added to the package's search path below.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

_TREE = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "strategies").is_dir() and (_TREE / "strategies").is_dir():
    __path__.append(str(_TREE))  # noqa: F821 (a package's __path__)
