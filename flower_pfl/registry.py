"""Strategy name -> (Strategy class, NumPyClient class, hyper-parameter defaults).

A new algorithm is one file in ``strategies/``, one in ``clients/`` and one module in
``flower_pfl/catalog/`` whose ``ENTRIES`` list its :class:`~flower_pfl.hyper.Entry`
objects (one per registered name; variants of one paper share a module). This module
collects every catalog module it finds, so adding an algorithm edits no shared file.
Classes are named by import path and loaded lazily, so reading the registry (e.g. to
validate a YAML file) imports neither torch nor Flower.
"""

from __future__ import annotations

import importlib
import pkgutil

from flower_pfl import catalog
from flower_pfl.hyper import Entry, Hyper  # noqa: F401 - Hyper: importable here as before hyper.py


def _collect() -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for info in sorted(pkgutil.iter_modules(catalog.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{catalog.__name__}.{info.name}")
        for entry in module.ENTRIES:
            if entry.name in entries:
                raise RuntimeError(f"strategy '{entry.name}' is registered twice "
                                   f"(second time in {module.__name__})")
            entries[entry.name] = entry
    return entries


REGISTRY: dict[str, Entry] = _collect()


def get(name: str) -> Entry:
    if name not in REGISTRY:
        raise KeyError(f"unknown strategy '{name}'; registered: {sorted(REGISTRY)}")
    return REGISTRY[name]
