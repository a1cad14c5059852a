"""flower_pfl.running.app_stage: the folder ``flwr run`` bundles.

The bundle Flower builds from the staged folder is byte for byte the one it builds from this
checkout (its .venv, .git and caches included); on a hand-made tree the walk leaves out
exactly the hidden folders, ``__pycache__``, the folders ``.gitignore`` names plainly (the
anchored one only at the top) and symbolic links, and reads no ``.gitignore`` that has a
negation; ``FLOWER_PFL_FLOWER_APP=1`` hands over the folder itself."""

from __future__ import annotations

import os
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
