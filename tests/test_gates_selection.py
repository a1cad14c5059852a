"""The test-selection gate can fail (the other gates: tests/test_gates.py): every test
function on disk is collected, the default run (``pytest``, ``-m 'not slow'``) deselects only
tests marked slow, no test-looking function, class or file is left out by its name, a
misspelt marker and an xfail that passes fail the run, and the slow tier's two halves
(scripts/slow_tier.sh) are disjoint and together the whole slow tier.

Each check collects in a pytest of its own, started with the running interpreter
(``sys.executable``, wherever it lives) and without what would carry this session's selection
or plugins into it (``PYTEST_ADDOPTS``, e.g. ``-k disk``): its verdict is the same whatever
this session selected.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the environment variables through which a pytest session reaches a pytest it starts: the
#: options (a -k or -m selection in PYTEST_ADDOPTS), plugins, and pytest's and xdist's own
SESSION_VARS = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST", "PYTEST_VERSION")


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a pytest (or a script that runs one) it starts, without
    this session's selection and plugins; ``extra`` added."""
    env = {k: v for k, v in os.environ.items()
           if k not in SESSION_VARS and not k.startswith("PYTEST_XDIST_")}
    return {**env, **extra}


# ---------------------------------------------------------------- test selection (pytest)

PROBE = textwrap.dedent("""\
    import json, os
    _seen = {"deselected": [], "deselected_fast": []}

    def pytest_deselected(items):
        _seen["deselected"] += [i.nodeid for i in items]
        _seen["deselected_fast"] += [i.nodeid for i in items if not i.get_closest_marker("slow")]

    def pytest_collection_finish(session):
        with open(os.environ["GATES_PROBE_OUT"], "w") as fh:
            json.dump({"selected": [i.nodeid for i in session.items],
                       "selected_slow": sorted(i.nodeid for i in session.items
                                               if i.get_closest_marker("slow")),
                       "deselected": _seen["deselected"],
                       "deselected_fast": _seen["deselected_fast"]}, fh)
""")
HELPERS = {"conftest.py", "netns.py", "__init__.py"}


def _base(nodeid: str) -> str:
    return re.sub(r"\[.*\]$", "", nodeid)


def defined_tests(tests: Path = ROOT / "tests") -> set[str]:
    """``tests/test_x.py::name`` (``::Class::name``) of every test pytest would collect by
    its name, read from the files."""
    sys.path.insert(0, str(ROOT))
    from tests.mutations.mutation_table import fast_tests

    out = set()
    for path in sorted(tests.rglob("test_*.py")):
        fast, slow = fast_tests(path)
        rel = path.relative_to(tests.parent).as_posix()
        out |= {f"{rel}::{n}" for n in fast | slow}
    return out


def misnamed(tests: Path = ROOT / "tests") -> list[str]:
    """What looks like a test but pytest's names leave out: a file defining ``test_*``
    functions not named ``test_*.py``; a function with an ``assert`` whose name does not
    start with ``test``, no fixture, used nowhere in the folder; a class with ``test_*``
    methods not named ``Test*``, or a ``Test*`` class with an ``__init__``; a test defined
    twice in one file (the second hides the first)."""
    problems = []
    trees = {p: ast.parse(p.read_text()) for p in sorted(tests.rglob("*.py"))}
    used = {n.id for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name)} | \
        {n.attr for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Attribute)} | \
        {a.name for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ImportFrom)
         for a in n.names}
    for path, tree in trees.items():
        funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if not path.name.startswith("test_") and path.name not in HELPERS and \
                any(f.name.startswith("test") for f in funcs):
            problems.append(f"{path.name}: defines tests but is not named test_*.py")
        names = [f.name for f in funcs]
        problems += [f"{path.name}: {n} defined twice" for n in sorted(set(names))
                     if n.startswith("test") and names.count(n) > 1]
        for f in funcs:
            fixture = any("fixture" in ast.unparse(d) for d in f.decorator_list)
            asserts = any(isinstance(n, ast.Assert) for n in ast.walk(f))
            if not f.name.startswith("test") and asserts and not fixture and f.name not in used:
                problems.append(f"{path.name}: {f.name} asserts but is no test and not called")
        for c in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            methods = {m.name for m in c.body if isinstance(m, ast.FunctionDef)}
            if not c.name.startswith("Test") and any(m.startswith("test") for m in methods):
                problems.append(f"{path.name}: class {c.name} has tests but is not Test*")
            if c.name.startswith("Test") and "__init__" in methods:
                problems.append(f"{path.name}: class {c.name} has an __init__ (not collected)")
    return problems


def test_the_name_checks_find_each_kind_of_misnamed_test(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "check_extra.py").write_text("def test_a():\n    assert 1\n")
    (tmp_path / "tests" / "test_x.py").write_text(textwrap.dedent("""\
        def tset_typo():
            assert 1 == 2
        def helper():
            assert True
        def test_b():
            helper()
        def test_b():
            assert 1
        class Checks:
            def test_c(self):
                assert 1
        class TestD:
            def __init__(self):
                pass
            def test_d(self):
                assert 1
    """))
    assert misnamed(tmp_path / "tests") == [
        "check_extra.py: defines tests but is not named test_*.py",
        "test_x.py: test_b defined twice",
        "test_x.py: tset_typo asserts but is no test and not called",
        "test_x.py: class Checks has tests but is not Test*",
        "test_x.py: class TestD has an __init__ (not collected)"]
    assert misnamed() == []


def test_every_test_on_disk_is_collected_and_only_slow_ones_are_deselected(tmp_path):
    (tmp_path / "gates_probe.py").write_text(PROBE)
    seen = tmp_path / "seen.json"
    env = child_env(PYTHONPATH=os.pathsep.join(
        [str(tmp_path)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        GATES_PROBE_OUT=str(seen))
    # the fast tier's own selection (pyproject's addopts), nothing else: not this session's
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "-p", "gates_probe"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = json.loads(seen.read_text())
    fast, slow = set(got["selected"]), set(got["deselected"])
    assert fast and slow and not fast & slow
    assert got["selected_slow"] == []  # the fast tier runs no slow test
    assert got["deselected_fast"] == []  # ... and leaves out no fast one
    # every test defined on disk is in one tier or the other
    collected = {_base(n) for n in fast | slow}
    assert defined_tests() - collected == set()
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")}
    assert files - {n.split("::")[0] for n in fast | slow} == set()

    # the slow tier's two halves, as scripts/slow_tier.sh runs them
    # (the script passes -q itself; with --collect-only each half lists its node ids), with
    # this interpreter, not the checkout's .venv (its default)
    halves = subprocess.run(["bash", str(ROOT / "scripts" / "slow_tier.sh"), "--collect-only"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env=child_env(PY=sys.executable))
    assert halves.returncode == 0, halves.stdout[-3000:] + halves.stderr[-3000:]
    text = halves.stdout.split("=== slow tier, half B")
    a, b = ({line.strip() for line in t.splitlines() if "::" in line} for t in text)
    assert a and b and not a & b
    assert a | b == slow


def test_a_selection_of_this_session_does_not_reach_the_pytests_it_starts(monkeypatch):
    monkeypatch.setenv("PYTEST_ADDOPTS", "-k disk")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    env = child_env(PY="python")
    assert "PYTEST_ADDOPTS" not in env and "PYTEST_XDIST_WORKER" not in env
    assert env["PY"] == "python" and env["PATH"] == os.environ["PATH"]


def test_a_misspelt_marker_and_a_passing_xfail_fail_the_run(tmp_path):
    (tmp_path / "test_planted.py").write_text(textwrap.dedent("""\
        import pytest

        @pytest.mark.slwo
        def test_meant_to_be_slow():
            pass

        @pytest.mark.xfail(reason="planted")
        def test_passes_though_marked_xfail():
            pass
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
                          "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
                          str(tmp_path / "test_planted.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert out.returncode != 0
    assert "'slwo' not found in `markers`" in out.stdout + out.stderr
    (tmp_path / "test_planted.py").write_text(
        "import pytest\n\n\n@pytest.mark.xfail(reason='planted')\ndef test_x():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
                          "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
                          str(tmp_path / "test_planted.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert out.returncode == 1 and "XPASS(strict)" in out.stdout
