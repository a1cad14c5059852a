"""Strategy name -> its catalog :class:`~flower_pfl.hyper.Entry`, Strategy class and client class.

The entries (name, summary, hyper-parameters) are torch-free data in
``flower_pfl/catalog/<paper>.py``; this module collects every catalog module it finds, so
reading the registry (validating a YAML file, ``flower-pfl strategies``) imports neither
torch nor Flower.  The classes bind themselves, in code:

    @strategy_for(catalog.fedamp.FEDAMP)      # strategies/fedamp.py: strategy -> its entry
    class FedAMP(MessagePassingStrategy): ...

    @client_for(FedAMP, HeurFedAMP)           # clients/fedamp.py: client -> the strategies
    class FedAMPClient(PersonalStateClient): ...  # it serves (a client may serve several)

so a misspelt entry or class fails when its module is imported, and the import graph shows
strategy -> catalog and client -> strategy.  Every entry is bound to exactly one strategy
class and one client class (tests/test_registry.py).

:func:`strategy_class` and :func:`client_class` import only the module that binds the name:
several strategy modules import torch, and a numpy strategy's ServerApp must not.
:func:`locate` finds that module by reading the decorators in the package's sources (ast,
nothing executed); the import then does the binding, and :func:`bindings` imports every
module (tests: the source reading and the bindings agree).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from flower_pfl import catalog
from flower_pfl.hyper import Entry

STRATEGIES = "flower_pfl.strategies"
CLIENTS = "flower_pfl.clients"
RECIPE = "README.md, 'Adding an algorithm, in order'"

T = TypeVar("T", bound=type)


def _collect() -> tuple[dict[str, Entry], dict[str, str]]:
    entries: dict[str, Entry] = {}
    modules: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(catalog.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{catalog.__name__}.{info.name}")
        for entry in module.ENTRIES:
            if entry.name in entries:
                raise RuntimeError(f"strategy '{entry.name}' is registered twice "
                                   f"(second time in {module.__name__})")
            entries[entry.name], modules[entry.name] = entry, info.name
    return entries, modules


REGISTRY: dict[str, Entry]
#: strategy name -> the catalog module that defines it (``fedamp`` for catalog/fedamp.py)
CATALOG_MODULE: dict[str, str]
REGISTRY, CATALOG_MODULE = _collect()

_STRATEGY: dict[str, type] = {}  # entry name -> strategy class (filled by @strategy_for)
_CLIENT: dict[type, type] = {}  # strategy class -> client class (filled by @client_for)


def get(name: str) -> Entry:
    if name not in REGISTRY:
        raise KeyError(f"unknown strategy '{name}'; registered: {sorted(REGISTRY)}")
    return REGISTRY[name]


def strategy_for(entry: Entry) -> Callable[[T], T]:
    """Class decorator: bind a Strategy class to its catalog entry (one class per entry,
    one entry per class)."""
    if not isinstance(entry, Entry) or REGISTRY.get(entry.name) is not entry:
        raise TypeError(f"@strategy_for takes an Entry of a catalog module's ENTRIES "
                        f"(flower_pfl/catalog/<paper>.py), got {entry!r:.80}")

    def bind(cls: T) -> T:
        named = [n for n, c in _STRATEGY.items() if c is cls and n != entry.name]
        if named:
            raise RuntimeError(f"{_path(cls)} is bound to '{named[0]}' and to '{entry.name}': "
                               f"one class per strategy (subclass it for the second)")
        other = _STRATEGY.get(entry.name)
        if other is not None and other is not cls:
            raise RuntimeError(f"strategy '{entry.name}' is bound twice: to "
                               f"{_path(other)} and to {_path(cls)}")
        _STRATEGY[entry.name] = cls
        return cls
    return bind


def client_for(*strategies: type) -> Callable[[T], T]:
    """Class decorator: bind a client class to the Strategy classes it serves (each strategy
    has one client; a client may serve several strategies)."""
    def bind(cls: T) -> T:
        for strategy in strategies:
            if strategy not in _STRATEGY.values():
                raise TypeError(f"@client_for({strategy!r:.80}) on {_path(cls)}: not a Strategy "
                                f"class bound with @strategy_for")
            other = _CLIENT.get(strategy)
            if other is not None and other is not cls:
                raise RuntimeError(f"{_path(strategy)} has two clients: {_path(other)} and "
                                   f"{_path(cls)}")
            _CLIENT[strategy] = cls
        return cls
    return bind


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class Location:
    """Where a strategy name's classes are defined: (module, class name) pairs."""

    strategy: tuple[str, str] | None
    client: tuple[str, str] | None


def _sources(package: str) -> Iterator[tuple[str, ast.Module]]:
    """(module name, parsed source) of every module of ``package``, without importing them."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} not found")
    folder = Path(list(spec.submodule_search_locations)[0])
    for path in sorted(folder.glob("*.py")):
        if path.name != "__init__.py":
            yield f"{package}.{path.stem}", ast.parse(path.read_text(encoding="utf-8"))


def _decorated(package: str, decorator: str
               ) -> Iterator[tuple[str, str, list[str | None]]]:
    """(module, class name, dotted names of the decorator's arguments) for every top-level
    class of ``package`` decorated with ``flower_pfl.registry.<decorator>(...)``."""
    for module, tree in _sources(package):
        names: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
            elif isinstance(node, ast.Import):
                names.update({a.asname or a.name: a.name if a.asname else a.name.split(".")[0]
                              for a in node.names})

        def dotted(expr: ast.expr) -> str | None:
            if isinstance(expr, ast.Name):
                return names.get(expr.id, f"{module}.{expr.id}")  # noqa: B023 - this module's
            if isinstance(expr, ast.Attribute):
                base = dotted(expr.value)
                return base and f"{base}.{expr.attr}"
            return None

        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and dotted(d.func) == f"{__name__}.{decorator}":
                        yield module, node.name, [dotted(a) for a in d.args]


def _attribute(dotted: str | None) -> Any:
    module, _, name = (dotted or "").rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


@functools.lru_cache(maxsize=None)
def _index() -> tuple[dict[str, tuple[str, str]], dict[tuple[str, str], tuple[str, str]]]:
    strategies: dict[str, tuple[str, str]] = {}
    for module, cls, args in _decorated(STRATEGIES, "strategy_for"):
        entry = _attribute(args[0]) if len(args) == 1 else None  # a catalog module: no torch
        if isinstance(entry, Entry):
            strategies.setdefault(entry.name, (module, cls))
    clients: dict[tuple[str, str], tuple[str, str]] = {}
    for module, cls, args in _decorated(CLIENTS, "client_for"):
        for arg in args:
            owner, _, name = (arg or "").rpartition(".")
            clients.setdefault((owner, name), (module, cls))
    return strategies, clients


def locate(name: str) -> Location:
    """Where the classes bound to strategy ``name`` are, read from the sources: nothing is
    imported but the catalog (``flower-pfl strategies NAME`` shows it without torch)."""
    get(name)
    strategies, clients = _index()
    strategy = strategies.get(name)
    return Location(strategy, clients.get(strategy) if strategy else None)


def strategy_class(name: str) -> type:
    """The Strategy class bound to ``name``; imports its module only."""
    entry = get(name)
    where = locate(name).strategy
    if where is not None:
        importlib.import_module(where[0])
    if entry.name not in _STRATEGY:
        raise LookupError(f"no Strategy class is bound to '{name}': decorate one in "
                          f"strategies/<file>.py with @strategy_for(<its catalog entry>) "
                          f"({RECIPE})")
    return _STRATEGY[entry.name]


def client_class(name: str) -> type:
    """The client class bound to ``name``'s Strategy class; imports its module only."""
    strategy = strategy_class(name)
    where = locate(name).client
    if where is not None:
        importlib.import_module(where[0])
    if strategy not in _CLIENT:
        raise LookupError(f"no client class serves '{name}' ({_path(strategy)}): list it in a "
                          f"client's @client_for(...) in clients/<file>.py ({RECIPE})")
    return _CLIENT[strategy]


def bindings() -> dict[str, tuple[type | None, type | None]]:
    """Import every strategy and client module; name -> (Strategy class, client class),
    None where nothing is bound."""
    for package in (STRATEGIES, CLIENTS):
        for module, _ in _sources(package):
            importlib.import_module(module)
    return {name: (_STRATEGY.get(name), _CLIENT.get(_STRATEGY.get(name)))  # type: ignore[arg-type]
            for name in REGISTRY}


def training_table(keys: Sequence[str]) -> str:
    """The Markdown table of docs/training.md: strategy x ``train.*`` key, each cell "used"
    (changing it changes what the client uploads) or "refused (n)" (validation stops with the
    entry's reason n, listed below the table, when the key is set to anything but its
    default).  There is no third kind: a key whose role the method's own hyper-parameters
    take is refused, the reason naming them (``hyper.<name>.alpha``, written
    ``hyper.<strategy>.alpha`` in the note, so that a family's identical notes share a
    number).
    tests/test_training_recipe.py checks every cell and that docs/training.md holds this
    table.  ``keys``: the columns, the configuration's ``train.*`` keys
    (:func:`flower_pfl.config.train_keys`; the registry does not import the configuration,
    which imports it)."""
    notes: list[str] = []

    def note(text: str) -> int:
        if text not in notes:
            notes.append(text)
        return notes.index(text) + 1

    rows = ["| strategy | " + " | ".join(f"`{k}`" for k in keys) + " |",
            "|---|" + "---|" * len(keys)]
    for name in sorted(REGISTRY):
        reasons = {key: reason.replace(f"hyper.{name}.", "hyper.<strategy>.")
                   for key, reason in REGISTRY[name].refuses.items()}
        cells = [f"refused ({note(reasons[key])})" if key in reasons else "used"
                 for key in keys]
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines = [f"{i}. {text}." for i, text in enumerate(notes, 1)]
    return "\n".join(rows) + ("\n\n" + "\n".join(lines) if lines else "") + "\n"


def refused_train_keys(name: str, values: Mapping[str, Any], fields: Mapping[str, Any]
                       ) -> list[str]:
    """One problem per ``train.*`` key that strategy ``name`` refuses (its catalog entry's
    ``refuses``) and ``values`` sets to something other than the key's default
    (``fields``: config.FIELDS)."""
    problems = []
    for key, reason in REGISTRY[name].refuses.items():
        default = fields[key].default
        if key in values and values[key] != default:
            problems.append(f"'{key}' = {values[key]!r} is not used by '{name}': {reason} -- "
                            f"leave it at {default!r}")
    return problems
