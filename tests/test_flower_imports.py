"""Flower's current import paths, and no DeprecationWarning from our own imports (#54).

Flower 1.21 moved the app API to ``flwr.app`` (Context, Message, ArrayRecord, ConfigRecord,
MetricRecord, RecordDict, Array, ...), ``flwr.serverapp`` (ServerApp, Grid, ...) and
``flwr.clientapp`` (ClientApp); the old ``flwr.common`` / ``flwr.server`` / ``flwr.client``
names are kept as re-exports and are deprecated, mostly without any Python warning (Flower
logs its deprecations, it does not ``warnings.warn`` them). So two checks:

1. Static (:func:`scan_file`): every ``from flwr.common|server|client[...] import NAME`` in the
   project's .py files (flower_pfl/ with its strategies/ and clients/, benchmarks/, scripts/,
   tests/; also ``flwr.common.NAME`` attribute use, and the same forms written inside strings:
   subprocess code, ``"module:NAME"`` references, dotted patch targets) fails when NAME is the
   *same object* under one of the current modules. The current names are read from Flower
   itself (each current module's ``__all__``), so a later Flower that moves more names makes
   this test name them. Legacy names with no current home (NumPyClient, FitIns, Parameters,
   the legacy Strategy, ClientProxy, the logger, ...) pass.
2. Dynamic (:data:`IMPORT_ALL`): a fresh interpreter imports every module of flower_pfl
   (``pkgutil.walk_packages``) with DeprecationWarning an *error* for warnings attributed to
   our modules (module name ``flower_pfl`` or ``flower_pfl.*``) and ignored for everyone
   else's (click/typer warn when ``flwr`` is imported). The plant tests prove the filter is
   live: a planted module named like ours that warns, or that imports a deprecated stdlib
   module (``imp``, which warns at its importer), fails the run; the same warning from a
   module not named like ours does not; a library that adds its own DeprecationWarning filter
   while being imported (Flower's ``flwr.simulation.ray_transport.utils`` does
   ``filterwarnings("once", DeprecationWarning)``) cannot shadow ours.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
#: the folders whose .py files are checked (the top-level strategies/ and clients/ are links
#: into flower_pfl/ and are not walked twice)
SCANNED = ("flower_pfl", "benchmarks", "scripts", "tests")
LEGACY = ("flwr.common", "flwr.server", "flwr.client")
CURRENT = ("flwr.app", "flwr.serverapp", "flwr.clientapp")
_MISSING = object()


@functools.lru_cache(maxsize=None)
def current_names() -> dict[str, tuple[tuple[str, object], ...]]:
    """NAME -> ((current module, object), ...) over the public names (``__all__``) of
    :data:`CURRENT`, read from the installed Flower."""
    found: dict[str, list[tuple[str, object]]] = {}
    for module_name in CURRENT:
        module = importlib.import_module(module_name)
        public = getattr(module, "__all__", None) or [n for n in vars(module) if n[0] != "_"]
        for name in public:
            found.setdefault(name, []).append((module_name, getattr(module, name)))
    return {name: tuple(homes) for name, homes in found.items()}


def is_legacy(module: str) -> bool:
    """``flwr.common``, ``flwr.server``, ``flwr.client`` or a submodule of one (not
    ``flwr.serverapp`` / ``flwr.clientapp``, which only share a prefix)."""
    return any(module == p or module.startswith(p + ".") for p in LEGACY)


@functools.lru_cache(maxsize=None)
def _resolve(module: str, name: str) -> object:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        pass
    try:
        return importlib.import_module(f"{module}.{name}")
    except ImportError:
        return _MISSING


def current_home(module: str, name: str) -> str | None:
    """The current module that exports ``module.name`` as the same object, or None (not a
    legacy path, or a legacy name with no current home)."""
    if not is_legacy(module) or name not in current_names():
        return None
    obj = _resolve(module, name)
    if obj is _MISSING:
        return None
    return next((home for home, current in current_names()[name] if current is obj), None)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    module: str
    name: str
    home: str

    def __str__(self) -> str:
        return (f"{self.path}:{self.line}: {self.name} from {self.module} is deprecated; "
                f"use `from {self.home} import {self.name}`")


_FROM_IMPORT = re.compile(r"from\s+(flwr(?:\.\w+)+)\s+import\s+\(?\s*([\w\s,]+)")
_MODULE_REF = re.compile(r"(flwr(?:\.\w+)+):(\w+)")
_DOTTED = re.compile(r"flwr(?:\.\w+)+")


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _string_refs(text: str) -> Iterator[tuple[int, str, str]]:
    """(line offset in ``text``, module, NAME) for the Flower names a string takes."""
    for match in _FROM_IMPORT.finditer(text):
        for item in match.group(2).split(","):
            words = item.split()
            if words:
                yield text.count("\n", 0, match.start()), match.group(1), words[0]
    for match in _MODULE_REF.finditer(text):
        yield text.count("\n", 0, match.start()), match.group(1), match.group(2)
    if _DOTTED.fullmatch(text.strip()):
        module, _, name = text.strip().rpartition(".")
        yield 0, module, name


def references(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """(line, module, NAME) for every Flower name the source takes from a module: imports,
    attribute use through an imported Flower module, and the same written in strings."""
    aliases: dict[str, str] = {}  # local name -> Flower module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "flwr" or is_legacy(alias.name):
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        aliases["flwr"] = "flwr"
        elif isinstance(node, ast.ImportFrom) and node.module == "flwr" and not node.level:
            for alias in node.names:
                if is_legacy(f"flwr.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"flwr.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                yield getattr(alias, "lineno", node.lineno), node.module, alias.name
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node.value)
            if dotted is not None:
                head, _, rest = dotted.partition(".")
                if head in aliases:
                    module = ".".join(filter(None, (aliases[head], rest)))
                    yield node.lineno, module, node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "flwr." in node.value:
            for offset, module, name in _string_refs(node.value):
                yield node.lineno + offset, module, name


def scan_file(path: Path, root: Path = ROOT) -> list[Finding]:
    """The deprecated Flower paths in one .py file, in line order."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    found = {Finding(str(shown), line, module, name, home)
             for line, module, name in references(tree)
             if (home := current_home(module, name)) is not None}
    return sorted(found, key=lambda f: (f.line, f.name))


def project_files(root: Path = ROOT) -> list[Path]:
    """Every .py file under :data:`SCANNED` of ``root``; links (to a folder or a file) are
    not followed, so flower_pfl/strategies is read once whatever links point at it."""
    files = []
    for top in SCANNED:
        if (root / top).is_symlink():
            continue
        for folder, dirs, names in os.walk(root / top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(folder) / n for n in sorted(names)
                      if n.endswith(".py") and not (Path(folder) / n).is_symlink()]
    return files


def scan(root: Path = ROOT) -> list[Finding | str]:
    """The deprecated Flower paths in :func:`project_files` (and a line for each file that
    does not parse), this file aside: its plants spell them on purpose."""
    found: list[Finding | str] = []
    for path in project_files(root):
        if path == Path(__file__).resolve():
            continue
        try:
            found += scan_file(path, root)
        except SyntaxError as error:
            found.append(f"{path.relative_to(root)}:{error.lineno}: does not parse: {error.msg}")
    return found


# -- the static check --------------------------------------------------------------------


def test_current_names_come_from_flower():
    """The sets are Flower's own: the names #54 lists are there, each under its module."""
    names = current_names()
    for name in ("Context", "ArrayRecord", "ConfigRecord", "MetricRecord", "Message",
                 "RecordDict", "Array"):
        assert "flwr.app" in dict(names[name]), name
    for name, home in (("ServerApp", "flwr.serverapp"), ("Grid", "flwr.serverapp"),
                       ("ClientApp", "flwr.clientapp")):
        assert home in dict(names[name]), name
    assert "NumPyClient" not in names and "FitIns" not in names


def test_no_deprecated_flower_import_in_the_project():
    found = scan()
    assert not found, "deprecated Flower import paths:\n" + "\n".join(map(str, found))


PLANT = '''\
from flwr.common import Context, FitIns, ndarrays_to_parameters
from flwr.server import ServerApp, ServerConfig, strategy
from flwr.client import ClientApp as App, NumPyClient, mod
from flwr.app import RecordDict
from flwr.serverapp import Grid
import flwr.common as fc
from flwr import server


def f():
    from flwr.common.logger import log
    from flwr.common import (
        MetricRecord as M,
        Parameters,
    )
    return fc.ArrayRecord, fc.FitRes, server.Grid, log, M, Parameters


CODE = "from flwr.common import ConfigRecord; from flwr.common import Code"
NEED = "flwr.common:Message"
TARGET = "flwr.server.Grid"
CHILD = """
import sys
from flwr.common import RecordDict
"""
'''


def test_static_check_names_each_planted_deprecated_path(tmp_path):
    """An asymmetric plant: deprecated and legacy names side by side, as imports, aliases,
    attributes and strings; exactly the deprecated ones are named, each with its line and
    current module (``flwr.client.mod`` and ``flwr.server.strategy`` are other modules than
    ``flwr.clientapp.mod`` / ``flwr.serverapp.strategy``, so they pass)."""
    path = tmp_path / "plant.py"
    path.write_text(PLANT)
    got = [(f.line, f.module, f.name, f.home) for f in scan_file(path, tmp_path)]
    assert got == [
        (1, "flwr.common", "Context", "flwr.app"),
        (2, "flwr.server", "ServerApp", "flwr.serverapp"),
        (3, "flwr.client", "ClientApp", "flwr.clientapp"),
        (13, "flwr.common", "MetricRecord", "flwr.app"),
        (16, "flwr.common", "ArrayRecord", "flwr.app"),
        (16, "flwr.server", "Grid", "flwr.serverapp"),
        (19, "flwr.common", "ConfigRecord", "flwr.app"),
        (20, "flwr.common", "Message", "flwr.app"),
        (21, "flwr.server", "Grid", "flwr.serverapp"),
        (24, "flwr.common", "RecordDict", "flwr.app"),
    ]
    assert str(scan_file(path, tmp_path)[0]) == (
        "plant.py:1: Context from flwr.common is deprecated; use `from flwr.app import Context`")


def test_static_check_walks_every_folder_once(tmp_path):
    """A copy of the layout: a plant in each scanned folder is found, the one under
    flower_pfl/strategies once although strategies/ links to it, and a file outside the
    scanned folders is not read."""
    for folder in ("flower_pfl/strategies", "benchmarks", "scripts", "tests", "docs"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "m.py").write_text("from flwr.common import Context\n")
    (tmp_path / "strategies").symlink_to(tmp_path / "flower_pfl" / "strategies")
    (tmp_path / "tests" / "link.py").symlink_to(tmp_path / "benchmarks" / "m.py")
    assert [f.path for f in scan(tmp_path) if isinstance(f, Finding)] == [
        "flower_pfl/strategies/m.py", "benchmarks/m.py", "scripts/m.py", "tests/m.py"]


# -- the dynamic check -------------------------------------------------------------------

#: run as ``python -c IMPORT_ALL PACKAGE|- [NAME=PATH ...]``: loads each planted file as module
#: NAME, then imports every module of PACKAGE; prints ``imported NAME`` per module, and
#: ``FAIL NAME: ...`` for each that raised; exits 1 if any did
IMPORT_ALL = r'''
import importlib, importlib.util, pkgutil, sys, traceback, warnings

OURS = r"flower_pfl(\..*)?\Z"
warnings.simplefilter("ignore", DeprecationWarning)  # others' (click, typer at `import flwr`)
warnings.filterwarnings("error", category=DeprecationWarning, module=OURS)
OUR_FILTERS = warnings.filters[:2]
# a library that sets its own DeprecationWarning filter while being imported would put it in
# front of ours; it goes behind ours instead
_filterwarnings, _simplefilter = warnings.filterwarnings, warnings.simplefilter
def _behind_filterwarnings(*args, **kwargs):
    if len(args) < 6:
        kwargs["append"] = True
    _filterwarnings(*args, **kwargs)
def _behind_simplefilter(*args, **kwargs):
    if len(args) < 4:
        kwargs["append"] = True
    _simplefilter(*args, **kwargs)
warnings.filterwarnings, warnings.simplefilter = _behind_filterwarnings, _behind_simplefilter

failed = []
def fail(name):
    error = sys.exc_info()[1]
    failed.append(name)
    print(f"FAIL {name}: {type(error).__name__}: {error}")
    traceback.print_exc(limit=-3)

def load(name, path=None):
    try:
        if path is None:
            importlib.import_module(name)
        else:
            spec = importlib.util.spec_from_file_location(name, path)
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except BaseException:
        fail(name)
        return
    if warnings.filters[:2] != OUR_FILTERS:
        failed.append(name)
        print(f"FAIL {name}: the DeprecationWarning filter was replaced while importing it")
        return
    print(f"imported {name}")

package, plants = sys.argv[1], sys.argv[2:]
for plant in plants:
    load(*plant.split("=", 1))
if package != "-":
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".",
                                                               onerror=fail)]
    for name in names:
        load(name)
sys.exit(1 if failed else 0)
'''


def import_all(package: str, *plants: tuple[str, Path]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    return subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, package, *(f"{n}={p}" for n, p in plants)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _modules_on_disk(package: str) -> set[str]:
    base = ROOT / package
    names = set()
    for path in base.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_flower_pfl_module_imports_without_a_deprecation_warning():
    """Every module of flower_pfl, strategies and clients included (the imported set is the
    set of .py files on disk), imports with our DeprecationWarnings as errors."""
    run = import_all("flower_pfl")
    assert run.returncode == 0, run.stdout + run.stderr
    imported = set(re.findall(r"^imported (\S+)$", run.stdout, re.M))
    assert imported == _modules_on_disk("flower_pfl")
    assert {"flower_pfl.strategies.fedamp", "flower_pfl.clients.fedamp"} <= imported


def _plant(tmp_path: Path, name: str, source: str) -> tuple[str, Path]:
    path = tmp_path / f"{name.replace('.', '_')}.py"
    path.write_text(source)
    return name, path


WARNS = "import warnings\nwarnings.warn('planted', DeprecationWarning)\n"


def test_the_filter_fails_a_warning_from_a_module_named_ours(tmp_path):
    run = import_all("-", _plant(tmp_path, "flower_pfl._probe", WARNS))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL flower_pfl._probe: DeprecationWarning: planted" in run.stdout


def test_the_filter_fails_a_deprecated_import_in_a_module_named_ours(tmp_path):
    """``imp`` warns at its importer (stacklevel 2, import machinery skipped): the warning is
    ours, as a deprecated import of ours would be."""
    run = import_all("-", _plant(tmp_path, "flower_pfl._probe", "import imp  # noqa\n"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL flower_pfl._probe: DeprecationWarning: the imp module is deprecated" \
        in run.stdout


def test_the_filter_passes_warnings_from_other_modules(tmp_path):
    """The same warning from a module not named like ours (``flower_pflx`` only shares the
    prefix) passes: click/typer's warnings at ``import flwr`` do not fail the check."""
    run = import_all("-", _plant(tmp_path, "someone_else", WARNS),
                     _plant(tmp_path, "flower_pflx", WARNS))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "imported someone_else" in run.stdout and "imported flower_pflx" in run.stdout


def test_a_library_filter_cannot_shadow_ours(tmp_path):
    """A module that sets ``filterwarnings("once", DeprecationWarning)`` at import (as
    Flower's ray_transport.utils does) or ``simplefilter("ignore")`` does not turn the check
    off for the modules imported after it."""
    quiet = ("import warnings\nwarnings.filterwarnings('once', category=DeprecationWarning)\n"
             "warnings.simplefilter('ignore')\n")
    run = import_all("-", _plant(tmp_path, "quiet_lib", quiet),
                     _plant(tmp_path, "flower_pfl._probe", WARNS))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "imported quiet_lib" in run.stdout
    assert "FAIL flower_pfl._probe: DeprecationWarning: planted" in run.stdout
