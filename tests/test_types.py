"""The type check (pyproject.toml's [tool.mypy], `.ci/run`'s types stage) catches a wrong
argument type in a call into the algorithms, under the project's own configuration."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CALLER = textwrap.dedent("""\
    import numpy as np

    from flower_pfl.algorithms.attention import fedacs_weights, quantile_threshold

    cosine = np.eye(3)
    peers = np.ones(3, dtype=bool)
    delta = quantile_threshold(cosine, 0.5)
    fedacs_weights(cosine, np.arange(3), peers, delta)
    fedacs_weights("cosine", np.arange(3), peers, delta)
""")


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    try:
        import mypy  # noqa: F401
    except ImportError as exc:
        raise AssertionError("mypy is not installed: `bash scripts/setup.sh` installs the "
                             "test extra (pyproject.toml), which has it") from exc
    caller = tmp_path / "caller.py"
    caller.write_text(source)
    # run from the repository root: its flower_pfl is the one checked, under its config
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                           str(ROOT / "pyproject.toml"), "--no-error-summary", str(caller)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_mypy_reports_a_str_passed_where_the_attention_weights_want_an_array(tmp_path):
    out = _mypy(tmp_path, CALLER)
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    # exactly the bad call (line 9), nothing from the good calls or the import
    assert len(errors) == 1, out.stdout + out.stderr
    assert "caller.py:9:" in errors[0]
    assert 'Argument 1 to "fedacs_weights" has incompatible type "str"' in errors[0]
    assert errors[0].endswith("[arg-type]")
    assert out.returncode == 1


def test_mypy_passes_the_same_calls_with_arrays(tmp_path):
    out = _mypy(tmp_path, CALLER.replace('"cosine"', "cosine"))
    assert out.returncode == 0, out.stdout + out.stderr
