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

A run whose ``model`` is a factory reference (``package.module:factory``) needs that module
wherever the ServerApp and ClientApps run: :func:`stage_user_model` puts the module file
(``module.py``) or package folder (``package/``) found in the run's folders (the config
file's folder, then the current one) at the top of the staged folder -- which Flower puts
on ``sys.path`` where it loads the app -- and rewrites the staged ``pyproject.toml`` (a new
file, never the checkout's) so ``fab-include`` takes it.  A module found only among the
installed packages is not staged: every node needs it installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Mapping, Sequence

from flower_pfl.factory_ref import check_factory_reference as check_factory_reference

if sys.version_info >= (3, 11):
    import tomllib
else:  # Flower's own dependency on 3.10
    import tomli as tomllib

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
            if src.is_symlink() or name == ".git":  # a worktree's or submodule's git pointer
                continue
            try:
                os.link(src, target / name)
            except OSError:  # another file system, or links not allowed
                shutil.copy2(src, target / name)
    return dest


def app_for_flwr_run(app_dir: Path, scratch: Path,
                     run_config: Mapping[str, str | bool] | None = None) -> Path:
    """The folder to hand ``flwr run``: :func:`stage` of ``app_dir`` in ``scratch/app``
    with the run's own model module (:func:`stage_user_model`, where ``run_config``'s
    ``cfg`` names a factory; its ``config-file``'s folder is searched first), or
    ``app_dir`` itself when ``FLOWER_PFL_FLOWER_APP=1`` (no model module is staged then)."""
    if os.environ.get(ENV_OFF, "") == "1":
        return Path(app_dir)
    staged = stage(Path(app_dir), Path(scratch) / "app")
    cfg = str((run_config or {}).get("cfg", "") or "")
    reference = json.loads(cfg).get("values", {}).get("model", "") if cfg else ""
    if ":" in reference:
        config_file = str((run_config or {}).get("config-file", "") or "")
        search = ([Path(config_file).parent] if config_file else []) + [Path.cwd()]
        stage_user_model(staged, reference, search, Path(app_dir))
    return staged


# --------------------------------------------------------------------- your own model
def user_module_source(reference: str, search: Sequence[Path]) -> Path | None:
    """The file ``<top>.py`` or folder ``<top>/`` (``top``: the reference's first name) in
    the first folder of ``search`` that holds one; None: not there (an installed package,
    or nowhere -- the preflight check says which)."""
    top = reference.partition(":")[0].split(".")[0]
    for folder in search:
        for candidate in (Path(folder) / f"{top}.py", Path(folder) / top):
            if candidate.is_file() or candidate.is_dir():
                return candidate.resolve()
    return None


class StageError(ValueError):
    """The run's model module cannot be put into the app bundle."""


def stage_user_model(staged: Path, reference: str, search: Sequence[Path],
                     app_dir: Path | None = None) -> str | None:
    """Put the module of ``reference`` (found by :func:`user_module_source`) at the top of
    ``staged`` (hard links or copies; a package's ``__pycache__`` and hidden folders left
    out) and add it to the staged ``pyproject.toml``'s ``fab-include`` (``/<top>.py`` or
    ``/<top>/**/*.py``: a package's Python files travel, nothing else).  Returns that
    pattern, or None for a module not found in ``search`` (installed: nothing to stage).
    A module inside ``app_dir`` is already staged: only the pattern is added.  Raises
    StageError where the name is one of the app's own top-level names."""
    source = user_module_source(reference, search)
    if source is None:
        return None
    inside = app_dir is not None and source.is_relative_to(Path(app_dir).resolve())
    target, top = staged / source.name, source.name.removesuffix(".py")
    if not inside:
        if (staged / top).exists() or (staged / f"{top}.py").exists():
            raise StageError(f"model '{reference}': the app has a top-level '{top}' of its "
                             f"own; rename your module")
        if source.is_dir():
            stage(source, target)
        else:
            shutil.copy2(source, target)
    pattern = f"/{source.name}/**/*.py" if source.is_dir() else f"/{source.name}"
    toml = staged / "pyproject.toml"
    text = toml.read_text()
    new = re.sub(r"(fab-include\s*=\s*\[)", lambda m: f'{m.group(1)}"{pattern}", ', text,
                 count=1)
    if pattern not in tomllib.loads(new).get("tool", {}).get("flwr", {}).get(
            "app", {}).get("fab-include", []):
        raise StageError(f"model '{reference}': could not add '{pattern}' to fab-include in "
                         f"{toml}")
    toml.unlink()  # a hard link to the checkout's file: write a new one, not through it
    toml.write_text(new)
    return pattern
