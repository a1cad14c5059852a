"""The mutation suite's table: what each mutation patches and which tests must notice.

The entries live as data in tests/mutations/data/: one ``<module>.yaml`` per catalog
module (``flower_pfl/catalog/<module>.py``) and ``core.yaml`` for shared code (the folder's
README.md says what each field means); :func:`load_mutations` reads them into
:class:`Mutation` records and refuses an entry with a missing or an unknown field.
``kind`` (optional) says what the patch does: ``switch-off`` (the default: a mechanism
turned off while the code runs) or ``subtle`` (the mechanism still runs, one detail is
wrong: a sign, a factor of 2, a norm for a squared norm, two similar variables swapped, an
axis); ``--kind`` of tests/mutations/mutations.py selects one.
:func:`check_patches` checks that every patch still applies (its ``old`` text occurs
exactly once in its file, the names are unique), :func:`check_coverage` that every
registered strategy is covered by at least one mutation of its own paper's file and that no
mutation names an unknown strategy, :func:`check_targets` that every target names a fast test
that exists (read from the test files, not imported), :func:`check_placement` that each
entry is in its paper's file;
tests/mutations/mutations.py runs them before anything else, tests/test_registry.py in the fast
tier.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the repository root
#: one file per catalog module, plus core.yaml (README.md there: the fields)
TABLE = Path(__file__).resolve().parent / "data"
CORE = "core"


@dataclass(frozen=True)
class Mutation:
    name: str
    strategies: tuple[str, ...]
    file: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest targets, the cheapest killer first (-x stops there)
    kind: str = "switch-off"  # or "subtle" (KINDS)
    table: str = ""  # the file it is read from, e.g. "fedamp.yaml" (not a YAML field)


#: what a mutation does: turn a mechanism off, or get one detail of it subtly wrong
KINDS = ("switch-off", "subtle")
OPTIONAL = {"kind"}


def load_mutations(path: Path = TABLE) -> tuple[Mutation, ...]:
    """The entries of the table at ``path`` (a folder: its ``*.yaml`` files by name), in
    order."""
    path = Path(path)
    if path.is_dir():
        return tuple(m for file in sorted(path.glob("*.yaml")) for m in load_mutations(file))
    entries = yaml.safe_load(path.read_text()) or []
    allowed = [f.name for f in fields(Mutation) if f.name != "table"]
    wanted = [name for name in allowed if name not in OPTIONAL]
    out = []
    for i, entry in enumerate(entries):
        keys = set(entry) if isinstance(entry, dict) else set()
        if not set(wanted) <= keys <= set(allowed):
            raise ValueError(f"{path}: entry {i + 1} ({entry.get('name') if keys else entry!r})"
                             f" needs the fields {wanted} (optional: {sorted(OPTIONAL)}); "
                             f"missing {sorted(set(wanted) - keys)}, unknown "
                             f"{sorted(keys - set(allowed))}")
        kind = str(entry.get("kind", "switch-off"))
        if kind not in KINDS:
            raise ValueError(f"{path}: entry {i + 1} ({entry['name']}): kind {kind!r} is not "
                             f"one of {KINDS}")
        out.append(Mutation(str(entry["name"]), tuple(entry["strategies"]), entry["file"],
                            entry["old"], entry["new"], tuple(entry["tests"]), kind, path.name))
    return tuple(out)


def check_patches(mutations: Sequence[Mutation], root: Path = ROOT) -> list[str]:
    """Every ``old`` text must occur exactly once in its file (else the patch has rotted)."""
    problems = []
    for m in mutations:
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.name}: {m.file} does not exist")
            continue
        if path.resolve() != path.absolute():  # the runner's copy keeps links as links,
            # but a patch through one names a file the tests do not import by that path
            problems.append(f"{m.name}: {m.file} goes through a link; name the file itself "
                            f"({path.resolve().relative_to(root.resolve()).as_posix()})")
        count = path.read_text().count(m.old)
        if count != 1:
            problems.append(f"{m.name}: the old text occurs {count} times in {m.file} "
                            f"(must be exactly once): {m.old!r}")
        if m.old == m.new:
            problems.append(f"{m.name}: old and new text are the same")
    names = [m.name for m in mutations]
    problems += [f"mutation name {n!r} is used twice" for n in sorted(set(names))
                 if names.count(n) > 1]
    return problems


def check_coverage(mutations: Sequence[Mutation]) -> list[str]:
    """Every registered strategy must be covered by at least one mutation of its own paper's
    file (``<catalog module>.yaml``): a shared ``core.yaml`` entry that lists it (e.g. one
    that switches off a mechanism of every strategy) does not test its own idea."""
    sys.path.insert(0, str(ROOT))
    from flower_pfl import registry

    covered = {s for m in mutations for s in m.strategies}
    own = {s for m in mutations for s in m.strategies
           if m.table == f"{registry.CATALOG_MODULE.get(s)}.yaml"}
    problems = [f"strategy {s!r} is registered but no mutation covers it (add one to "
                f"tests/mutations/data/<its catalog module>.yaml)"
                for s in sorted(set(registry.REGISTRY) - covered)]
    problems += [f"strategy {s!r} is covered only by shared entries, none of its own paper's "
                 f"(add one to tests/mutations/data/{registry.CATALOG_MODULE.get(s)}.yaml)"
                 for s in sorted((set(registry.REGISTRY) & covered) - own)]
    problems += [f"mutation covers {s!r}, which is not a registered strategy"
                 for s in sorted(covered - set(registry.REGISTRY))]
    return problems


def _marked_slow(decorators: Iterable[ast.expr]) -> bool:
    return any("mark.slow" in ast.unparse(d) for d in decorators)


def fast_tests(path: Path) -> tuple[set[str], set[str]]:
    """The test functions of the test file ``path`` (``name`` or ``Class::name``), read
    without importing it: (those the fast tier selects, those marked slow -- by their own
    decorator, their class's or the module's ``pytestmark``)."""
    tree = ast.parse(path.read_text())
    module_slow = any(isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        and "mark.slow" in ast.unparse(n.value) for n in tree.body)
    fast: set[str] = set()
    slow: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("test"):
            (slow if module_slow or _marked_slow(node.decorator_list) else fast).add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        item.name.startswith("test"):
                    name = f"{node.name}::{item.name}"
                    hidden = module_slow or _marked_slow(node.decorator_list) or \
                        _marked_slow(item.decorator_list)
                    (slow if hidden else fast).add(name)
    return fast, slow


def check_targets(mutations: Sequence[Mutation], root: Path = ROOT) -> list[str]:
    """Every target must select a fast test: its file exists, a node id names a test
    function defined there (parameter ids in brackets aside), and that test -- or, for a
    file target, at least one of its tests -- is not marked slow (the suite runs
    ``-m "not slow"``: a target that selects nothing would not be a killer)."""
    problems = []
    for m in mutations:
        for target in m.tests:
            file, _, node = target.partition("::")
            path = root / file
            if not path.is_file():
                problems.append(f"{m.name}: target {target}: {file} does not exist")
                continue
            fast, slow = fast_tests(path)
            name = re.sub(r"\[.*\]$", "", node)
            if not node and not fast:
                problems.append(f"{m.name}: target {target} has no fast test")
            elif node and name in slow:
                problems.append(f"{m.name}: target {target} is marked slow (the suite runs "
                                f"-m 'not slow')")
            elif node and name not in fast:
                problems.append(f"{m.name}: target {target}: no test {name!r} in {file}")
    return problems


def check_placement(mutations: Sequence[Mutation]) -> list[str]:
    """``<module>.yaml`` holds only entries of ``flower_pfl/catalog/<module>.py``'s strategies
    that patch that paper's files; ``core.yaml`` the rest (shared code: ``flower_pfl/``
    outside ``algorithms/``, strategy and client modules that bind no entry; mechanisms of
    several catalog modules)."""
    sys.path.insert(0, str(ROOT))
    from flower_pfl import registry

    paper = registry.CATALOG_MODULE
    bound = {c.__module__.replace(".", "/") + ".py"
             for pair in registry.bindings().values() for c in pair if c is not None}
    sides = ("flower_pfl/strategies/", "flower_pfl/clients/")
    problems = []
    for m in mutations:
        shared = (m.file.startswith("flower_pfl/") and not m.file.startswith(
            ("flower_pfl/algorithms/", *sides))) or (m.file.startswith(sides)
                                                     and m.file not in bound)
        modules = {paper.get(s) for s in m.strategies}
        want = CORE if shared or len(modules) != 1 else modules.pop()
        if m.table != f"{want}.yaml":
            problems.append(f"{m.name}: belongs in tests/mutations/data/{want}.yaml, not "
                            f"{m.table} (strategies {list(m.strategies)}, file {m.file})")
    return problems

