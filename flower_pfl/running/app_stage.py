"""The folder ``flwr run`` bundles: the app without the folders Flower would walk in vain.

``flwr run APP`` builds the app bundle (FAB) from APP's files: Flower's
``flwr.cli.utils.collect_files`` walks *every* file under APP and resolves each, and only then
do the ``.gitignore``, ``fab-include`` and built-in exclude rules pick the ~120 files the
bundle holds.  A checkout set up as README.md says has its virtual environment inside
(``.venv``: ~50,000 files), so every ``flower-pfl run`` -- and every bench cell, every
``submit`` -- spent seconds of its start in that walk (docs/BENCHMARKS.md (a), fixed cost).

:func:`stage` gives ``flwr run`` a folder of hard links (copies across file systems) to
APP's files, found by a walk that does not enter

* a hidden folder (``.venv``, ``.git``, the tool caches) or ``__pycache__``: no rule of
  this app includes a file under one, and Flower's built-in rules exclude ``__pycache__``;
* a folder the top-level ``.gitignore`` names plainly (``outputs/``, ``/state/``; no wildcard):
  Flower drops every ``.gitignore``d file from a bundle anyway.  A ``.gitignore`` with a
  negation (``!``) is not read at all, since a negation can bring a file back.

Flower then applies all its own rules to the staged folder unchanged, so the bundle is byte
for byte the one built from APP (tests/test_app_stage.py); symbolic links are skipped, as
Flower skips them.  ``FLOWER_PFL_FLOWER_APP=1`` hands ``flwr run`` APP itself (the
measurement's "before" arm).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

#: set to 1: ``flwr run`` gets the app folder itself, as before
ENV_OFF = "FLOWER_PFL_FLOWER_APP"


def ignored_folders(app_dir: Path) -> set[str]:
    """The folders ``app_dir/.gitignore`` ignores by plain name: ``{"outputs", "/state"}``
    (a leading ``/``: at the top only); empty when there is no such file or it has a
    negation."""
    try:
        lines = (app_dir / ".gitignore").read_text().splitlines()
    except OSError:
        return set()
    names = set()
    for line in (raw.strip() for raw in lines):
        if line.startswith("!"):
            return set()
        if not line.endswith("/") or any(c in line for c in "*?[\\"):
            continue
        name = line.rstrip("/")
        if name and "/" not in name.lstrip("/"):
            names.add(name)
    return names


def stage(app_dir: Path, dest: Path) -> Path:
    """Hard-link (or copy) the files of ``app_dir`` that a bundle can hold into ``dest``
    (created; must not exist) and return ``dest``."""
    app_dir = Path(app_dir)
    ignored = ignored_folders(app_dir)
    dest.mkdir(parents=True)
    for dirpath, dirnames, filenames in os.walk(app_dir, followlinks=False):
        rel = Path(dirpath).relative_to(app_dir)
        top = rel == Path(".")
        dirnames[:] = [d for d in dirnames
                       if not (d.startswith(".") or d == "__pycache__" or d in ignored
                               or (top and "/" + d in ignored))]
        target = dest / rel
        target.mkdir(exist_ok=True)
        for name in filenames:
            src = Path(dirpath) / name
            if src.is_symlink():
                continue
            try:
                os.link(src, target / name)
            except OSError:  # another file system, or links not allowed
                shutil.copy2(src, target / name)
    return dest


def app_for_flwr_run(app_dir: Path, scratch: Path) -> Path:
    """The folder to hand ``flwr run``: :func:`stage` of ``app_dir`` in ``scratch/app``, or
    ``app_dir`` itself when ``FLOWER_PFL_FLOWER_APP=1``."""
    if os.environ.get(ENV_OFF, "") == "1":
        return Path(app_dir)
    return stage(Path(app_dir), Path(scratch) / "app")
