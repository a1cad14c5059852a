"""strategies/ and clients/ are subpackages of flower_pfl (the top-level folders of a checkout
are links to them).

An installed flower-pfl must not collide with another project's ``strategies`` or ``clients``
module: from a source tree (checkout, editable install, app bundle) and from a wheel they are
``flower_pfl.strategies`` / ``flower_pfl.clients`` by plain imports, the top-level links refuse
to import as packages of their own, nothing else of the tree is part of the package, and each
class exists once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: run where flower_pfl is importable: the package path holds the two subpackages and nothing
#: else of the tree, each class once, and the registry finds the classes there
ONE_COPY = """
import importlib, json, sys
import flower_pfl
lazy = "flower_pfl.strategies" not in sys.modules
refused = []
for name in ("flower_pfl.tests", "flower_pfl.benchmarks", "flower_pfl.flower_pfl",
             "flower_pfl.flower_pfl.registry", "strategies", "clients.base"):
    try:
        importlib.import_module(name)
    except ImportError:
        refused.append(name)
from flower_pfl import registry
from flower_pfl.strategies import base
from flower_pfl.strategies.fedamp import FedAMP
same = (importlib.import_module("flower_pfl.strategies.base").PersonalizedStrategy
        is base.PersonalizedStrategy
        is sys.modules["flower_pfl.strategies.message_passing"].PersonalizedStrategy
        and registry.strategy_class("fedamp") is FedAMP
        and issubclass(FedAMP, base.PersonalizedStrategy))
print(json.dumps({"lazy": lazy, "refused": refused, "same": same,
                  "file": base.__file__, "client": registry.client_class("fedamp").__module__}))
"""

REFUSED = ["flower_pfl.tests", "flower_pfl.benchmarks", "flower_pfl.flower_pfl",
           "flower_pfl.flower_pfl.registry", "strategies", "clients.base"]


def one_copy(cwd: Path, pythonpath: Path) -> dict:
    import json

    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    out = subprocess.run([sys.executable, "-c", ONE_COPY], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["lazy"] and seen["same"] and seen["refused"] == REFUSED, seen
    assert seen["client"] == "flower_pfl.clients.fedamp"
    return seen


def test_from_the_source_tree_only_the_two_subpackages_join_the_package():
    """From a checkout: ``flower_pfl.tests`` and a doubled ``flower_pfl.flower_pfl`` do not
    import, nor ``strategies`` as a package of its own (a second copy of the classes)."""
    seen = one_copy(ROOT, ROOT)
    assert Path(seen["file"]) == ROOT / "flower_pfl" / "strategies" / "base.py"


def test_a_foreign_strategies_package_first_on_the_path_does_not_shadow_ours(tmp_path):
    for name in ("strategies", "clients"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('the foreign {name} package was imported')\n")
    code = ("from flower_pfl import registry; "
            "print(registry.strategy_class('fedamp').__module__, "
            "registry.client_class('fedamp').__module__)")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["flower_pfl.strategies.fedamp", "flower_pfl.clients.fedamp"]


def test_the_wheel_installs_strategies_and_clients_inside_the_package(tmp_path):
    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ there
    shutil.copytree(ROOT / "flower_pfl", src / "flower_pfl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", str(src), "-w", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("flower_pfl-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"flower_pfl", wheel.name.split("-py3")[0] + ".dist-info"}
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"flower_pfl/strategies/fedamp.py", "flower_pfl/clients/fedamp.py",
            "flower_pfl/algorithms/attention.py"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip installs: the wheel's files as they are
    seen = one_copy(tmp_path, site)
    assert Path(seen["file"]) == site / "flower_pfl" / "strategies" / "base.py"


def test_the_app_bundle_carries_the_code_and_stays_under_flowers_limit(tmp_path):
    """`flwr run` builds a FAB from the repository: it must hold the apps' code and configs
    and stay under Flower's size limit whatever docs/results/ grows to (its committed result
    cells alone are over it)."""
    import io

    from flwr.cli.build import build_fab_from_disk
    from flwr.common.constant import FAB_MAX_SIZE

    fab = build_fab_from_disk(ROOT)
    assert len(fab) <= FAB_MAX_SIZE
    names = set(zipfile.ZipFile(io.BytesIO(fab)).namelist())
    assert {"flower_pfl/server_app.py", "flower_pfl/client_app.py",
            "flower_pfl/strategies/fedamp.py", "flower_pfl/clients/fedamp.py", "simulation.yaml",
            "configs/pfedbred-fmnist-mclr.yaml"} <= names
    assert not any(n.startswith(("docs/", "tests/", "benchmarks/")) for n in names)
    app = tmp_path / "app"  # as a SuperNode unpacks it
    zipfile.ZipFile(io.BytesIO(fab)).extractall(app)
    seen = one_copy(tmp_path, app)
    assert Path(seen["file"]) == app / "flower_pfl" / "strategies" / "base.py"
