"""Noise a user reads as a problem (issue 67): libraries' deprecation warnings at the top of
a run, flwr-datasets' progress bar, the package's internals in ``dir(flower_pfl)``."""

from __future__ import annotations

import warnings

import numpy as np

import flower_pfl
from flower_pfl.warnings_once import record_every_warning


def test_dir_of_the_package_lists_its_public_names_only():
    from flower_pfl import api  # noqa: F401 - a loaded submodule is no public name either

    assert dir(flower_pfl) == sorted(["run", "load_config", "RunResult", "RunFailed",
                                      "ConfigError", "PreflightError", "__version__"])
    assert all(callable(getattr(flower_pfl, n)) for n in dir(flower_pfl) if n != "__version__")


def test_libraries_deprecations_are_not_recorded_the_projects_warnings_are():
    with warnings.catch_warnings(record=True) as caught:
        record_every_warning()
        warnings.warn_explicit("'click.utils.get_text_stream' is deprecated",
                               DeprecationWarning, "typer/__init__.py", 25, module="typer")
        warnings.warn_explicit("old key", DeprecationWarning, "flower_pfl/config.py", 3,
                               module="flower_pfl.config")
        warnings.warn_explicit("3 clients test on unseen classes", UserWarning, "x.py", 1,
                               module="typer")
        warnings.warn_explicit("3 clients test on unseen classes", UserWarning, "x.py", 1,
                               module="typer")  # again: every time
    assert [(w.category, str(w.message)) for w in caught] == [
        (DeprecationWarning, "old key"), (UserWarning, "3 clients test on unseen classes"),
        (UserWarning, "3 clients test on unseen classes")]


def test_a_natural_partition_draws_no_progress_bar(capfd):
    from flower_pfl.learning import fixed_partitions

    parts = fixed_partitions.natural_partition(np.repeat(np.arange(12), 50), 12, "k")
    assert [len(p) for p in parts] == [50] * 12
    assert capfd.readouterr().err == ""


def test_importing_flowers_cli_under_the_launchers_capture_records_no_deprecation():
    """What put typer's DeprecationWarnings (about click) at the top of a run: the launcher
    records the warnings raised while it checks the run (``RunConsole.own_warnings``), and
    the first import of Flower's CLI, hence typer, happened inside.  A fresh interpreter,
    so typer is imported for the first time: the old filter (``always``) records them."""
    import subprocess
    import sys

    probe = ("import warnings\n"
             "from flower_pfl.warnings_once import record_every_warning\n"
             "with warnings.catch_warnings(record=True) as caught:\n"
             "    {setup}\n"
             "    import typer\n"
             "print(sum(issubclass(w.category, DeprecationWarning) for w in caught))\n")
    counts = [int(subprocess.run([sys.executable, "-c", probe.format(setup=setup)],
                                 capture_output=True, text=True, check=True).stdout)
              for setup in ("record_every_warning()", "warnings.simplefilter('always')")]
    assert counts[0] == 0 and counts[1] > 0
