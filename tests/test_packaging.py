"""strategies/ and clients/ are top-level folders but live in the flower_pfl namespace.

An installed flower-pfl must not collide with another project's ``strategies`` or ``clients``
module: from a source tree flower_pfl/__init__.py adds the folders to the package's path; a
wheel installs them inside the package (pyproject's ``package-dir``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_foreign_strategies_package_first_on_the_path_does_not_shadow_ours(tmp_path):
    for name in ("strategies", "clients"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('the foreign {name} package was imported')\n")
    code = ("from flower_pfl import registry; e = registry.get('fedamp'); "
            "print(e.strategy_cls().__module__, e.client_cls().__module__)")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["flower_pfl.strategies.fedamp", "flower_pfl.clients.fedamp"]


def test_the_wheel_installs_strategies_and_clients_inside_the_package(tmp_path):
    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ there
    for name in ("flower_pfl", "strategies", "clients"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
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


def test_the_app_bundle_carries_the_code_and_stays_under_flowers_limit():
    """`flwr run` builds a FAB from the repository: it must hold the apps' code and configs
    and stay under Flower's size limit whatever docs/results/ grows to (its committed result
    cells alone are over it)."""
    import io

    from flwr.cli.build import build_fab_from_disk
    from flwr.common.constant import FAB_MAX_SIZE

    fab = build_fab_from_disk(ROOT)
    assert len(fab) <= FAB_MAX_SIZE
    names = set(zipfile.ZipFile(io.BytesIO(fab)).namelist())
    assert {"flower_pfl/server_app.py", "flower_pfl/client_app.py", "strategies/fedamp.py",
            "clients/fedamp.py", "simulation.yaml", "configs/pfedbred-fmnist-mclr.yaml"} <= names
    assert not any(n.startswith(("docs/", "tests/", "benchmarks/")) for n in names)
