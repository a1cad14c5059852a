"""Strategy name -> its catalog :class:`~flower_pfl.hyper.Entry`, Strategy class and client class.

The entries (each paper's contract: name, summary, parameters, messages, privacy decision,
mechanism, newcomer rule) are torch-free data in ``flower_pfl/catalog/<paper>.py``; this
module collects every catalog module it finds, so reading the registry (validating a YAML
file, ``flower-pfl strategies``) imports neither torch nor Flower.  The classes bind
themselves to the contract, in code:

    @strategy_for(catalog.fedamp.FEDAMP)      # strategies/fedamp.py: strategy -> its entry
    class FedAMP(MessagePassingStrategy): ...

    @client_for(catalog.fedamp.FEDAMP, catalog.fedamp.HEURFEDAMP)  # clients/fedamp.py
    class FedAMPClient(PersonalStateClient): ...  # (a client may serve several entries)

so a misspelt entry or class fails when its module is imported, and the import graph shows
strategy -> catalog and client -> catalog: no client imports a strategy, and the ClientApp
loads no server code.  Every entry is bound to exactly one strategy class and one client
class (tests/test_registry.py).

The modules that bind are listed, by plain imports, in two index modules:
``flower_pfl/strategies/index.py`` and ``flower_pfl/clients/index.py``.
:func:`strategy_class` imports the strategy index (every strategy module: torch-free at
import, so a numpy strategy's ServerApp loads no torch), :func:`client_class` the client
index alone (clients train: torch).  The registry names the index by a string: the strategy
modules import this module (``strategy_for``), so an import statement here would close a
circle; mypy and the structure drawing follow the index modules themselves.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Mapping, Sequence, TypeVar

from flower_pfl import catalog
from flower_pfl.contract import Entry

STRATEGIES = "flower_pfl.strategies"
CLIENTS = "flower_pfl.clients"
#: the modules that import every module binding a strategy / a client (``MODULES``)
STRATEGY_INDEX = f"{STRATEGIES}.index"
CLIENT_INDEX = f"{CLIENTS}.index"
RECIPE = "docs/adding-a-method.md"

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
_CLIENT: dict[str, type] = {}  # entry name -> client class (filled by @client_for)


def get(name: str) -> Entry:
    if name not in REGISTRY:
        raise KeyError(f"unknown strategy '{name}'; registered: {sorted(REGISTRY)}")
    return REGISTRY[name]


def _checked(entry: object, decorator: str) -> Entry:
    """``entry``, refused unless it is an Entry of the catalog."""
    if not isinstance(entry, Entry) or REGISTRY.get(entry.name) is not entry:
        raise TypeError(f"@{decorator} takes an Entry of a catalog module's ENTRIES "
                        f"(flower_pfl/catalog/<paper>.py), got {entry!r:.80}")
    return entry


def _bind(table: dict[str, type], entry: Entry, cls: type, twice: str) -> None:
    """``table[entry.name] = cls``, refusing a second class for one entry (``twice``: what
    the error calls that)."""
    other = table.get(entry.name)
    if other is not None and other is not cls:
        raise RuntimeError(f"strategy '{entry.name}' {twice}: {_path(other)} and {_path(cls)}")
    table[entry.name] = cls


def strategy_for(entry: Entry) -> Callable[[T], T]:
    """Class decorator: bind a Strategy class to its catalog entry (one class per entry,
    one entry per class)."""
    _checked(entry, "strategy_for")

    def bind(cls: T) -> T:
        named = [n for n, c in _STRATEGY.items() if c is cls and n != entry.name]
        if named:
            raise RuntimeError(f"{_path(cls)} is bound to '{named[0]}' and to '{entry.name}': "
                               f"one class per strategy (subclass it for the second)")
        _bind(_STRATEGY, entry, cls, "is bound twice, to")
        return cls
    return bind


def client_for(*entries: Entry) -> Callable[[T], T]:
    """Class decorator: bind a client class to the catalog entries it serves (each entry has
    one client; a client may serve several entries)."""
    checked = [_checked(entry, "client_for") for entry in entries]

    def bind(cls: T) -> T:
        for entry in checked:
            _bind(_CLIENT, entry, cls, "has two clients")
        return cls
    return bind


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def strategy_class(name: str) -> type:
    """The Strategy class bound to ``name``.  Imports the strategy index (every strategy
    module; no torch).  KeyError: an unknown name; LookupError: no class bound to it."""
    entry = get(name)
    importlib.import_module(STRATEGY_INDEX)
    if entry.name not in _STRATEGY:
        raise LookupError(f"no Strategy class is bound to '{name}': decorate one in "
                          f"strategies/<file>.py with @strategy_for(<its catalog entry>) and "
                          f"import that module in {_file(STRATEGY_INDEX)} ({RECIPE})")
    return _STRATEGY[entry.name]


def client_class(name: str) -> type:
    """The client class bound to ``name``.  Imports the client index (every client module;
    torch), no strategy module.  KeyError: an unknown name; LookupError: no client serves
    it."""
    entry = get(name)
    importlib.import_module(CLIENT_INDEX)
    if entry.name not in _CLIENT:
        raise LookupError(f"no client class serves '{name}': list its entry in a client's "
                          f"@client_for(...) in clients/<file>.py and import that module in "
                          f"{_file(CLIENT_INDEX)} ({RECIPE})")
    return _CLIENT[entry.name]


def bindings() -> dict[str, tuple[type | None, type | None]]:
    """Import both indexes; name -> (Strategy class, client class), None where nothing is
    bound."""
    importlib.import_module(STRATEGY_INDEX)
    importlib.import_module(CLIENT_INDEX)
    return {name: (_STRATEGY.get(name), _CLIENT.get(name)) for name in REGISTRY}


def wire_classes() -> tuple[type, ...]:
    """Every message declaration: the round-level ones (flower_pfl.instructions) and each
    contract's (``Entry.wire``), each once."""
    from flower_pfl.instructions import DECLARATIONS

    out = dict.fromkeys(DECLARATIONS)
    for entry in REGISTRY.values():
        out.update(dict.fromkeys(entry.wire))
    return tuple(out)


def binding_modules() -> tuple[set[str], set[str]]:
    """The modules whose classes are bound so far: (strategy modules, client modules)."""
    return ({c.__module__ for c in _STRATEGY.values()},
            {c.__module__ for c in _CLIENT.values()})


def _file(module: str) -> str:
    return module.replace(".", "/") + ".py"


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


def strategies_table() -> str:
    """The Markdown table of docs/algorithms.md, one row per registered strategy from its
    contract: the summary (paper and equation), its parameters, the DP modes it allows and
    its newcomer rule (tests/test_contract.py keeps the doc equal to this)."""
    rows = ["| strategy | what it is | parameters | DP modes | newcomer |", "|---|---|---|---|---|"]
    for name in sorted(REGISTRY):
        e = REGISTRY[name]
        modes = [m for m in ("client-level", "sample-level")
                 if e.privacy is not None and e.privacy.refusal(m) is None]
        newcomer = ("not declared" if e.newcomer is None else
                    f"refused: {e.newcomer.refused}" if e.newcomer.refused else
                    f"{e.newcomer.rule} ({e.newcomer.basis})")
        params = ", ".join(f"`{k}`" for k in e.hyper) or "none"
        summary = e.summary.replace("|", "\\|")  # a norm's bars would end the cell
        rows.append(f"| `{name}` | {summary} | {params} | {', '.join(modes) or 'none'} | "
                    f"{newcomer} |")
    return "\n".join(rows) + "\n"


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
