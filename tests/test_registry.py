"""The registry: every catalog entry bound in code to one Strategy class and one client
class, a wrong binding refused at import, the launcher without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flower_pfl import registry
from flower_pfl.catalog import baselines

ROOT = Path(__file__).resolve().parent.parent


def test_every_entry_is_bound_to_one_strategy_and_one_client():
    bound = registry.bindings()
    assert list(bound) == list(registry.REGISTRY)
    unbound = [n for n, (s, c) in bound.items() if s is None or c is None]
    assert not unbound, f"entries without a strategy or client class: {unbound}"
    strategies = [s for s, _ in bound.values()]
    assert len(set(strategies)) == len(strategies)  # no strategy class bound twice
    for name, (strategy, client) in bound.items():
        assert strategy.__module__.startswith("flower_pfl.strategies.")
        assert client.__module__.startswith("flower_pfl.clients.")
        # what the sources say (read without importing) is what the imports bound
        where = registry.locate(name)
        assert where.strategy == (strategy.__module__, strategy.__qualname__), name
        assert where.client == (client.__module__, client.__qualname__), name
        assert registry.strategy_class(name) is strategy
        assert registry.client_class(name) is client
    # a client may serve several strategies (one paper's variants)
    assert bound["heurfedamp"][1] is bound["fedamp"][1]


def test_a_wrong_binding_is_refused_when_its_module_is_imported():
    from flower_pfl.hyper import Entry

    fedavg = registry.strategy_class("fedavg")
    with pytest.raises(TypeError, match="ENTRIES"):  # an entry not in the catalog
        registry.strategy_for(Entry("fedavg", "a copy"))
    with pytest.raises(RuntimeError, match="bound twice"):  # a second class for one entry
        registry.strategy_for(baselines.FEDAVG)(type("Other", (fedavg,), {}))
    with pytest.raises(RuntimeError, match="one class per strategy"):  # one class, two entries
        registry.strategy_for(baselines.LOCAL)(fedavg)
    with pytest.raises(TypeError, match="@strategy_for"):  # a client of an unbound class
        registry.client_for(type("NotAStrategy", (), {}))(type("C", (), {}))
    with pytest.raises(RuntimeError, match="two clients"):
        registry.client_for(fedavg)(type("SecondClient", (), {}))
    assert registry.strategy_class("fedavg") is fedavg and registry.strategy_class("local") \
        is not fedavg
    with pytest.raises(KeyError, match="unknown strategy 'fedavgg'"):
        registry.strategy_class("fedavgg")


LAUNCHER = """
import json, sys
from flower_pfl import cli
codes = [cli.main(["strategies"]), cli.main(["strategies", "fedamp"]),
         cli.main(["validate", "--config", "simulation.yaml", "--set", "strategy=pfedhn"])]
from flower_pfl import registry
where = registry.locate("plgu-ghn")
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules,
                  "strategies": sorted(m for m in sys.modules
                                       if m.startswith("flower_pfl.strategies.")),
                  "where": [list(where.strategy), list(where.client)]}))
"""


def test_the_launcher_lists_validates_and_locates_without_torch():
    """`flower-pfl strategies [NAME]` and config validation read the catalog and the sources,
    importing no strategy or client module (several import torch)."""
    out = subprocess.run([sys.executable, "-c", LAUNCHER], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["codes"] == [0, 0, 0]
    assert seen["torch"] is False and seen["strategies"] == []
    assert seen["where"] == [["flower_pfl.strategies.plgu", "PLGUGHN"],
                             ["flower_pfl.clients.plgu", "PLGUGHNClient"]]
    assert "strategy flower_pfl.strategies.fedamp.FedAMP, client " \
           "flower_pfl.clients.fedamp.FedAMPClient" in out.stdout


def test_a_strategy_lookup_imports_only_its_own_module():
    """The ServerApp of a numpy strategy must not import torch: the lookup imports the one
    module that binds the name, not every strategy (pFedHN's imports torch)."""
    code = ("import sys, json; from flower_pfl import registry; "
            "registry.strategy_class('fedamp'); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('flower_pfl.strat'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "flower_pfl.strategies.fedamp" in loaded
    assert not {"flower_pfl.strategies.pfedhn", "flower_pfl.strategies.heurfedamp"} & set(loaded)
