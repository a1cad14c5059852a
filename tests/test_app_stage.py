"""flower_pfl.running.app_stage: the folder ``flwr run`` bundles.

The bundle Flower builds from the staged folder is byte for byte the one it builds from this
checkout (its .venv, .git and caches included); on a hand-made tree the walk leaves out
exactly the hidden folders, ``__pycache__``, the folders ``.gitignore`` names plainly (the
anchored one only at the top) and symbolic links, and reads no ``.gitignore`` that has a
negation; ``FLOWER_PFL_FLOWER_APP=1`` hands over the folder itself.  A run whose model is a
factory (``module:factory``) gets its module file or package folder into the bundle, found
beside the config file, and importable where only the unpacked bundle is on ``sys.path``."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from flower_pfl.config import APP_DIR
from flower_pfl.running import app_stage

# Flower's bundle build still asks pathspec for its deprecated 'gitwildmatch' patterns
pytestmark = pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_the_bundle_from_the_staged_checkout_is_byte_for_byte_the_checkouts(tmp_path):
    staged = app_stage.stage(APP_DIR, tmp_path / "app")
    assert build_fab_from_disk(staged) == build_fab_from_disk(APP_DIR)
    assert not (staged / ".venv").exists() and not (staged / ".git").exists()


def _tree(root: Path, gitignore: str) -> None:
    for rel in ("pyproject.toml", "pkg/a.py", "pkg/__pycache__/a.pyc", ".venv/lib/x.py",
                "pkg/.hidden/h.py", "outputs/run/r.py", "pkg/outputs/o.py", "state/s.py",
                "pkg/state/s.py", "docs/results/d.json", "docs/keep.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".gitignore").write_text(gitignore)
    os.symlink(root / "pkg" / "a.py", root / "pkg" / "link.py")


def test_the_walk_skips_hidden_cache_ignored_folders_and_links(tmp_path):
    _tree(tmp_path / "src", "outputs/\n/state/\ndocs/results/\n*.log\nbuild*/\n# c\n")
    staged = app_stage.stage(tmp_path / "src", tmp_path / "app")
    assert _files(staged) == {".gitignore", "pyproject.toml", "pkg/a.py", "pkg/state/s.py",
                              "docs/results/d.json", "docs/keep.md"}
    # hard links: the same file, no copy
    assert os.path.samefile(staged / "pkg" / "a.py", tmp_path / "src" / "pkg" / "a.py")
    assert app_stage.ignored_folders(tmp_path / "src") == {"outputs", "/state"}


def test_a_negation_in_gitignore_prunes_nothing_it_names(tmp_path):
    _tree(tmp_path / "src", "outputs/\n!outputs/run/r.py\n")
    assert app_stage.ignored_folders(tmp_path / "src") == set()
    staged = app_stage.stage(tmp_path / "src", tmp_path / "app")
    assert "outputs/run/r.py" in _files(staged) and "pkg/outputs/o.py" in _files(staged)


def test_flowers_own_behaviour_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv(app_stage.ENV_OFF, "1")
    assert app_stage.app_for_flwr_run(APP_DIR, tmp_path) == APP_DIR
    monkeypatch.delenv(app_stage.ENV_OFF)
    assert app_stage.app_for_flwr_run(APP_DIR, tmp_path) == tmp_path / "app"


# --------------------------------------------------------------------- your own model
def _run_config(reference: str, config_file: Path) -> dict:
    values = {"model": reference, "model-args": {}, "data.dataset": "fmnist", "seed": 0}
    return {"cfg": json.dumps({"values": values, "hyper": {}, "source": str(config_file)}),
            "config-file": str(config_file)}


def _bundle(folder: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(folder))) as z:
        return {name: z.read(name) for name in z.namelist()}


def _fab_include(files: dict[str, bytes]) -> list[str]:
    toml = app_stage.tomllib.loads(files["pyproject.toml"].decode())
    return list(toml["tool"]["flwr"]["app"]["fab-include"])


def test_the_bundle_carries_the_runs_own_model_module_and_package(tmp_path):
    project = tmp_path / "project"
    (project / "mypkg" / "nets" / "__pycache__").mkdir(parents=True)
    (project / "ownnet.py").write_text("def make():\n    return None\n")
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "nets" / "__init__.py").write_text("from .cnn import make\n")
    (project / "mypkg" / "nets" / "cnn.py").write_text("def make():\n    return 1\n")
    (project / "mypkg" / "nets" / "__pycache__" / "cnn.pyc").write_bytes(b"x")
    (project / "run.yaml").write_text("model: ownnet:make\n")
    checkout_toml = (APP_DIR / "pyproject.toml").read_bytes()

    staged = app_stage.app_for_flwr_run(APP_DIR, tmp_path / "a",
                                        _run_config("ownnet:make", project / "run.yaml"))
    files = _bundle(staged)
    assert files["ownnet.py"] == (project / "ownnet.py").read_bytes()
    assert "/ownnet.py" in _fab_include(files)
    assert (APP_DIR / "pyproject.toml").read_bytes() == checkout_toml  # not written through
    # the rest of the bundle is the checkout's
    plain = _bundle(app_stage.app_for_flwr_run(APP_DIR, tmp_path / "b"))
    assert set(files) - set(plain) == {"ownnet.py"}

    staged = app_stage.app_for_flwr_run(APP_DIR, tmp_path / "c",
                                        _run_config("mypkg.nets.cnn:make", project / "run.yaml"))
    files = _bundle(staged)
    assert {"mypkg/__init__.py", "mypkg/nets/__init__.py", "mypkg/nets/cnn.py"} <= set(files)
    assert not any("__pycache__" in name for name in files)
    assert "/mypkg/**/*.py" in _fab_include(files)
    # a built-in model stages nothing; an installed module (found nowhere here) neither
    for ref in ("cnn", "yaml:safe_load"):
        assert app_stage.stage_user_model(app_stage.stage(APP_DIR, tmp_path / ref), ref,
                                          [project], APP_DIR) is None


def test_a_module_named_like_the_apps_own_folders_is_refused(tmp_path):
    (tmp_path / "flower_pfl.py").write_text("def make():\n    return None\n")
    staged = app_stage.stage(APP_DIR, tmp_path / "app")
    with pytest.raises(app_stage.StageError, match="has a top-level 'flower_pfl' of its own"):
        app_stage.stage_user_model(staged, "flower_pfl:make", [tmp_path], APP_DIR)
    # the top-level strategies/ and clients/ are links the bundle leaves out (the code is
    # flower_pfl.clients): a user's own `clients` module is staged, it shadows nothing
    (tmp_path / "clients.py").write_text("def make():\n    return None\n")
    assert app_stage.stage_user_model(staged, "clients:make", [tmp_path], APP_DIR) == "/clients.py"
    assert (staged / "clients.py").is_file() and not (staged / "strategies").exists()


@pytest.mark.parametrize("value, ok", [("m:f", True), ("pkg.mod:make", True),
                                       ("mod:Net.build", True), ("cnn", False),
                                       ("mod:", False), (":f", False), ("a-b:f", False),
                                       ("a:b:c", False), ("class:f", False), (3, False)])
def test_the_factory_reference_syntax(value, ok):
    problem = app_stage.check_factory_reference(value)
    assert (problem is None) == ok, problem


def test_the_unpacked_bundle_builds_the_model_where_the_config_folder_is_gone(tmp_path):
    """As on a SuperNode: only the bundle's folder on sys.path (Flower's load_app), the
    launcher's config folder missing, another working folder."""
    import subprocess
    import sys

    project = tmp_path / "project"
    project.mkdir()
    (project / "stagednet.py").write_text(
        "from torch import nn\n\ndef make(classes=10):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(784, classes))\n")
    (project / "run.yaml").write_text("")
    run_config = _run_config("stagednet:make", project / "run.yaml")
    unpacked = tmp_path / "fab"
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(
            app_stage.app_for_flwr_run(APP_DIR, tmp_path / "s", run_config)))) as z:
        z.extractall(unpacked)
    (project / "stagednet.py").unlink()
    code = ("import sys, json; sys.path.insert(0, sys.argv[1])\n"
            "from flower_pfl.learning.models import model_for\n"
            "values = json.loads(sys.argv[2])['values']\n"
            "m = model_for(values)\n"
            "import flower_pfl.learning.user_model as um, stagednet\n"
            "print(type(m).__name__, stagednet.__file__.startswith(sys.argv[1]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(unpacked), run_config["cfg"]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["UserModel", "True"], done.stderr[-2000:]
