"""Every module of flower_pfl/clients that binds a client (``@client_for``), imported by
name: :func:`flower_pfl.registry.client_class` imports this module (clients train, so this
imports torch), and with it every client class is bound.  Each client module binds to the
contracts it serves (``@client_for(<paper>.<NAME>)``) and imports no strategy module.
tests/test_registry.py checks that every module of the package
that binds a client is listed here (a module left out would leave its strategies without a
client).
"""

from __future__ import annotations

from types import ModuleType

from flower_pfl.clients import (  # noqa: F401 - imported to bind (MODULES below reads them)
    apfl,
    ditto,
    fedacs,
    fedamp,
    fedavg,
    fedbabu,
    fedbn,
    fedfomo,
    fedper,
    fedprox,
    fedrep,
    fedrod,
    fedsam,
    ifca,
    lgfedavg,
    local,
    perfedavg,
    pfedbred,
    pfedhn,
    plgu,
    scaffold,
    selffl,
)

#: the modules that bind, read from the import above (one line per module: add it there)
MODULES: tuple[ModuleType, ...] = tuple(
    m for m in dict(globals()).values()
    if isinstance(m, ModuleType) and m.__name__.startswith(f"{__package__}."))
