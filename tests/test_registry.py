"""The registry: every catalog entry bound in code to one Strategy class and one client
class, a wrong binding refused at import, each binding module listed in its package's index,
the strategy modules torch-free at import, the launcher without torch or Flower."""

from __future__ import annotations

import importlib
import json
import pkgutil
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
        assert strategy is not None and client is not None
        assert strategy.__module__.startswith("flower_pfl.strategies.")
        assert client.__module__.startswith("flower_pfl.clients.")
        assert registry.strategy_class(name) is strategy
        assert registry.client_class(name) is client
    # a client may serve several strategies (one paper's variants)
    assert bound["heurfedamp"][1] is bound["fedamp"][1]


def _import_every_module(package: str) -> set[str]:
    """Import every module of ``package`` found on disk (each binds what it decorates)."""
    found = pkgutil.iter_modules(importlib.import_module(package).__path__)
    return {importlib.import_module(f"{package}.{info.name}").__name__ for info in found}


def _unindexed(index_modules: tuple[object, ...], binding: set[str]) -> list[str]:
    """The modules that bind (``binding``) but the index does not list, and those it lists
    that bind nothing."""
    listed = {getattr(m, "__name__", "") for m in index_modules}
    return sorted((binding - listed) | (listed - binding))


def test_every_module_that_binds_is_listed_in_its_index():
    """A strategy or client module left out of flower_pfl/strategies/index.py or
    flower_pfl/clients/index.py would leave its names unbound for strategy_class /
    client_class: every module of each package is imported, and those that bind are
    exactly the index's."""
    from flower_pfl.clients import index as clients
    from flower_pfl.clients import state
    from flower_pfl.strategies import index as strategies

    on_disk = _import_every_module(registry.STRATEGIES) | _import_every_module(registry.CLIENTS)
    s_modules, c_modules = registry.binding_modules()
    assert s_modules | c_modules <= on_disk
    assert _unindexed(strategies.MODULES, s_modules) == []
    assert _unindexed(clients.MODULES, c_modules) == []
    # the check does fail: an index without fedamp's module, and one listing a module that
    # binds nothing
    fedamp = "flower_pfl.strategies.fedamp"
    assert _unindexed(tuple(m for m in strategies.MODULES if m.__name__ != fedamp),
                      s_modules) == [fedamp]
    assert _unindexed((*clients.MODULES, state), c_modules) == ["flower_pfl.clients.state"]


def test_a_wrong_binding_is_refused_when_its_module_is_imported():
    from flower_pfl.contract import Decision, Entry

    fedavg = registry.strategy_class("fedavg")
    with pytest.raises(TypeError, match="ENTRIES"):  # an entry not in the catalog
        registry.strategy_for(Entry("fedavg", "a copy", Decision("w", None, None)))
    with pytest.raises(TypeError, match="@client_for.*ENTRIES"):  # likewise for a client
        registry.client_for(Entry("fedavg", "a copy", Decision("w", None, None)))
    with pytest.raises(RuntimeError, match="bound twice"):  # a second class for one entry
        registry.strategy_for(baselines.FEDAVG)(type("Other", (fedavg,), {}))
    with pytest.raises(RuntimeError, match="one class per strategy"):  # one class, two entries
        registry.strategy_for(baselines.LOCAL)(fedavg)
    with pytest.raises(TypeError, match="@client_for"):  # a client bound to a class
        registry.client_for(fedavg)(type("C", (), {}))
    with pytest.raises(RuntimeError, match="two clients"):
        registry.client_for(baselines.FEDAVG)(type("SecondClient", (), {}))
    assert registry.strategy_class("fedavg") is fedavg and registry.strategy_class("local") \
        is not fedavg
    with pytest.raises(KeyError, match="unknown strategy 'fedavgg'"):
        registry.strategy_class("fedavgg")


def test_an_unbound_name_says_where_to_bind_and_list_it(monkeypatch):
    """A catalog entry whose module is not in the index: the lookup names the decorator and
    the index file."""
    registry.bindings()
    monkeypatch.delitem(registry._STRATEGY, "fedamp")
    with pytest.raises(LookupError, match=r"@strategy_for.*flower_pfl/strategies/index\.py"):
        registry.strategy_class("fedamp")
    monkeypatch.undo()
    monkeypatch.delitem(registry._CLIENT, "fedavg")
    with pytest.raises(LookupError, match=r"@client_for.*flower_pfl/clients/index\.py"):
        registry.client_class("fedavg")


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return seen


LAUNCHER = """
import json, sys
from flower_pfl import cli
codes = [cli.main(["strategies"]),
         cli.main(["validate", "--config", "simulation.yaml", "--set", "strategy=pfedhn"])]
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules, "flwr": "flwr" in sys.modules,
                  "strategies": sorted(m for m in sys.modules
                                       if m.startswith("flower_pfl.strategies."))}))
"""


def test_the_launcher_lists_and_validates_without_torch_or_flower():
    """`flower-pfl strategies` and config validation read the catalog only: no strategy or
    client module, neither torch nor Flower."""
    seen = _run(LAUNCHER)
    assert seen == {"codes": [0, 0], "torch": False, "flwr": False, "strategies": []}


def test_importing_every_strategy_module_imports_no_torch():
    """The ServerApp of a numpy strategy must not load torch: strategy_class imports the
    strategy index (every strategy module), each of which imports torch only inside the
    method that uses it.  Every module of the package, index or not, is imported here."""
    code = ("import importlib, json, pkgutil, sys\n"
            "from flower_pfl import registry, strategies\n"
            "registry.strategy_class('fedamp')\n"
            "indexed = sorted(m for m in sys.modules if m.startswith('flower_pfl.strategies.'))\n"
            "for info in pkgutil.iter_modules(strategies.__path__):\n"
            "    importlib.import_module('flower_pfl.strategies.' + info.name)\n"
            "print(json.dumps({'torch': sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'torchvision')), 'indexed': indexed}))")
    seen = _run(code)
    assert seen["torch"] == [], "a strategy module imports torch at its top"
    assert {"flower_pfl.strategies.pfedhn", "flower_pfl.strategies.plgu",
            "flower_pfl.strategies.index"} <= set(seen["indexed"])


def test_every_mutation_entry_applies_covers_and_sits_in_its_papers_file():
    """The mutation suite's start-up checks, without running a target: each registered name
    in an entry of its own paper's file, names unique, each ``old`` text once in its file,
    each target a fast test that exists, each entry in ``<catalog module>.yaml`` or
    ``core.yaml`` as the folder's README says (tests/test_gates.py plants a gap for each)."""
    from tests.mutations.mutation_table import (
        TABLE,
        check_coverage,
        check_patches,
        check_placement,
        check_targets,
        load_mutations,
    )

    mutations = load_mutations()
    assert len(mutations) > len(registry.REGISTRY)
    assert check_patches(mutations) == []
    assert check_coverage(mutations) == []
    assert check_targets(mutations) == []
    assert check_placement(mutations) == []
    files = {p.stem for p in TABLE.glob("*.yaml")}
    assert files <= set(registry.CATALOG_MODULE.values()) | {"core"}
    # the placement check does fail: a paper's entry moved to another paper's file
    moved = [m if m.table != "fedamp.yaml" else type(m)(**{**m.__dict__, "table": "plgu.yaml"})
             for m in mutations]
    assert any("belongs in tests/mutations/data/fedamp.yaml" in p
               for p in check_placement(moved))


def _recipe() -> str:
    """The page registry.RECIPE names (a path from the repository's root; followed by
    ``, '<heading>'`` where the recipe is one section of a longer page: from that heading on)."""
    page, _, rest = registry.RECIPE.partition(",")
    path = ROOT / page.strip()
    assert path.suffix == ".md" and path.is_file(), \
        f"registry.RECIPE names {page.strip()!r}: no such Markdown file"
    text = path.read_text()
    if "'" in rest:
        heading = rest.split("'")[1]
        assert heading in text, f"{page.strip()} has no '{heading}' (registry.RECIPE names it)"
        text = text[text.index(heading):]
    return text


def test_the_recipe_names_what_the_checks_require():
    """The recipe a new algorithm follows and what the registry and the mutation suite check
    name the same files, decorators and commands."""
    from flower_pfl.running import inprocess
    from tests.mutations import mutations as suite
    from tests.mutations.mutation_table import TABLE

    recipe = _recipe()
    folder = TABLE.relative_to(ROOT).as_posix()
    for needed in (f"@{registry.strategy_for.__name__}(catalog.<NAME>)",
                   f"@{registry.client_for.__name__}(<paper>.<NAME>)",
                   "params: catalog.<Name>Params", "privacy=Decision(", "wire=(",
                   "flower_pfl/contract.py".rpartition("/")[2].removesuffix(".py"),
                   "tests/test_contract.py",
                   f"from flower_pfl.registry import {registry.strategy_for.__name__}",
                   f"from flower_pfl.registry import {registry.client_for.__name__}",
                   "flower_pfl/catalog/<paper>.py", "ENTRIES",
                   f"{registry.STRATEGIES.rpartition('.')[2]}/<name>.py",
                   f"{registry.CLIENTS.rpartition('.')[2]}/<name>.py",
                   registry.STRATEGY_INDEX.replace(".", "/") + ".py",
                   registry.CLIENT_INDEX.replace(".", "/") + ".py",
                   f"{folder}/<paper>.yaml",
                   "tests/test_registry.py", "tests/test_message_path.py",
                   "tests/mutations/mutations.py --only", "aggregate_updates"):
        assert needed in recipe, f"the recipe does not name {needed!r}"
    assert (TABLE / "README.md").is_file()
    assert "tests/mutations/data/<its" in suite.NOTE
    # its five lines of Python run as written (here the import; try_strategy's own test runs it)
    block = recipe.split("```python\n")[1].split("```")[0]
    assert len(block.strip().splitlines()) <= 5
    namespace: dict = {}
    exec(block.splitlines()[0], namespace)
    assert namespace["try_strategy"] is inprocess.try_strategy
    order = [recipe.index(s) for s in ("flower_pfl/catalog/<paper>.py", "strategies/<name>.py",
                                       "clients/<name>.py", f"{folder}/<paper>.yaml",
                                       "tests/test_<name>.py")]
    assert order == sorted(order), "the recipe's steps are out of order (catalog first)"


def test_try_strategy_runs_a_registered_strategy_for_the_rounds_asked(tmp_path):
    from flower_pfl.running.inprocess import try_strategy

    strategy = try_strategy("fedavg", rounds=2, results_dir=tmp_path,
                            overrides={"clients": 3, "data.subsample": 600})
    rows = (tmp_path / "rounds.csv").read_text().splitlines()
    assert strategy.results.dir == tmp_path and strategy.num_clients == 3
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
