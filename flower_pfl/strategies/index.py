"""Every module of flower_pfl/strategies that binds a strategy (``@strategy_for``), imported
by name: :func:`flower_pfl.registry.strategy_class` imports this module, and with it every
strategy class is bound.

The strategy modules are torch-free at import (a strategy that needs torch on the server --
pFedHN's hypernetwork, pFedBreD's and SCAFFOLD's math modules, the model PLGU-LF counts
layers of -- imports it inside the method that uses it), so this costs what Flower and numpy
cost, and a numpy strategy's ServerApp never loads torch.  tests/test_registry.py checks
both: importing this imports no torch, and every module of the package that binds a
strategy is listed here (a module left out would leave its strategies unbound).
"""

from __future__ import annotations

from types import ModuleType

from flower_pfl.strategies import (  # noqa: F401 - imported to bind (MODULES below reads them)
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
    heurfedamp,
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
