"""The mutation suite's warm runner (tests/mutations/mutation_fork.py): a fork of a parent that
imported the heavy libraries gives the verdict and output a new interpreter gives, each run
sees only its own copy of the tree, and the parent never imports this project's code."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.mutations import mutation_fork, mutations  # noqa: E402

#: in each planted tree: a module of the tree's own, and tests that read it
PLANTED = {
    "probe_mod.py": "VALUE = {name!r}\n",
    "test_probe.py": (
        "import json, os, sys\n"
        "import probe_mod\n\n"
        "def test_sees_its_own_copy():\n"
        "    assert probe_mod.VALUE == os.path.basename(os.getcwd())\n"
        "    assert probe_mod.__file__ == os.path.join(os.getcwd(), 'probe_mod.py')\n"
        "    assert os.environ['PROBE_ENV'] == probe_mod.VALUE\n"
        "    assert not hasattr(json, 'left_by_an_earlier_run')\n"
        "    json.left_by_an_earlier_run = True  # in this fork only\n\n"
        "def test_planted_failure():\n"
        "    assert os.environ.get('PLANT_FAILURE') != '1', 'planted'\n"),
}


def _tree(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    for file, text in PLANTED.items():
        (path / file).write_text(text.format(name=name))
    return path


def _env(tree: Path) -> dict[str, str]:
    return {**mutations.env_for(tree), "PROBE_ENV": tree.name}


def _same(text: str) -> str:
    """pytest's output without its timings."""
    return re.sub(r"\d+\.\d+s", "T", text)


@pytest.fixture(scope="module")
def light():
    """A warm parent that preloads pytest only (the real list takes seconds)."""
    with mutation_fork.WarmRunner(sys.executable, dict(os.environ), preload=("pytest",)) as r:
        yield r


def test_each_run_is_a_fresh_fork_that_sees_only_its_own_tree(tmp_path, light):
    for name in ("alpha", "beta", "alpha2"):  # a module imported by one run is not the next's
        tree = _tree(tmp_path, name)
        rc, out, err, timed_out = light.run(tree, _env(tree), ["-q", "-p", "no:cacheprovider",
                                                             "test_probe.py::test_sees_its_own_copy"])
        assert (rc, timed_out) == (0, False), out + err
        assert "1 passed" in out
    # the parent itself never imported the trees' module nor had its json touched
    modules = light.modules()
    assert "probe_mod" not in modules["modules"]
    assert modules["threads"] == modules["python_threads"] == 1


@pytest.mark.parametrize("case", ["passes", "fails", "no test", "bad option"])
def test_a_fork_gives_the_exit_status_and_output_of_a_new_interpreter(tmp_path, light, case,
                                                                      monkeypatch):
    tree = _tree(tmp_path, "gamma")
    monkeypatch.setenv("PROBE_ENV", tree.name)  # env_for(tree) hands both ways os.environ
    monkeypatch.setenv("PLANT_FAILURE", "1" if case == "fails" else "0")
    targets = {"passes": ["test_probe.py"], "fails": ["test_probe.py"],
               "no test": ["test_probe.py::test_renamed_away"],
               "bad option": ["--no-such-option", "test_probe.py"]}[case]
    (rc_f, out_f, _), (rc_s, out_s, _) = (
        mutations.run_pytest(sys.executable, tree, targets, runner=runner)
        for runner in (light, None))
    assert rc_f == rc_s == {"passes": 0, "fails": 1, "no test": 4, "bad option": 4}[case]
    assert _same(out_f) == _same(out_s)
    assert mutations.classify(rc_f, out_f) == mutations.classify(rc_s, out_s)
    if case == "fails":
        assert mutations.classify(rc_f, out_f) == (
            "killed", "test_probe.py::test_planted_failure")


def test_a_run_past_its_timeout_is_killed_and_reported(tmp_path, light):
    tree = tmp_path / "slowtree"
    tree.mkdir()
    (tree / "test_sleep.py").write_text("import time\n\ndef test_sleeps():\n"
                                        "    print('started', flush=True)\n    time.sleep(60)\n")
    rc, out, err, timed_out = light.run(tree, _env(tree), ["-q", "-s", "test_sleep.py"],
                                        timeout=1)
    assert (rc, timed_out) == (-1, True) and "started" in out
    rc, out, err, timed_out = light.run(tree, _env(tree), ["--version"])  # the parent goes on
    assert (rc, timed_out) == (0, False)


def test_the_warm_parent_preloads_the_libraries_and_none_of_the_project(tmp_path):
    with mutation_fork.WarmRunner(sys.executable, dict(os.environ)) as runner:
        seen = runner.modules()
        # the preloads are warm, nothing of this project is, and no thread runs at a fork
        assert set(mutation_fork.PRELOAD) <= set(seen["modules"])
        assert {"torch", "flwr", "numpy", "pytest"} <= set(seen["modules"])
        assert [m for m in seen["modules"] if m.split(".")[0] in mutation_fork.PROJECT] == []
        assert "ray" not in seen["modules"]  # tests/test_raynode.py: Ray never imported
        assert seen["python_threads"] == 1  # native: numpy's and scipy's OpenBLAS workers
        # and a fork of it imports the scratch copy's packages, not the installed ones
        scratch = mutations.make_scratch(tmp_path)
        where = mutations.check_shadowing(sys.executable, scratch, runner)
        assert set(where) == set(mutations.PACKAGES)
        assert all(Path(p).is_relative_to(scratch) for p in where.values())


@pytest.mark.parametrize("preload", [("flower_pfl",),  # project code in the parent
                                     ("pytest", "pandas")])  # pyarrow's jemalloc thread
def test_a_warm_parent_that_imports_project_code_or_starts_a_thread_refuses_to_start(
        preload, capfd):
    with pytest.raises(RuntimeError, match="ended"):
        mutation_fork.WarmRunner(sys.executable, dict(os.environ), preload=preload)
    err = capfd.readouterr().err
    assert ("project modules imported by the server: ['flower_pfl'" in err
            if preload == ("flower_pfl",) else "threads after importing" in err), err
