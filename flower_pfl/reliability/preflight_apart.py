"""The launcher's way to run :func:`~flower_pfl.reliability.preflight.preflight`: in a
short-lived child process (:func:`preflight_apart`), since checking the model imports torch,
which costs a process ~280 MB of private memory even on a CPU run, and the launcher lives as
long as the run.  The child's error comes back with the same message; its Python warnings
are raised again in the launcher.  Both names are importable from
:mod:`flower_pfl.reliability.preflight` as well.
"""

from __future__ import annotations

import builtins
import json
import pickle
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

from flower_pfl.atomic import atomic_write_text
from flower_pfl.child import run_python
from flower_pfl.warnings_once import record_every_warning

#: the child of :func:`preflight_apart`: request (pickle) in, answer (JSON) out
_PREFLIGHT_CHILD = ("import sys\n"
                    "from flower_pfl.reliability.preflight_apart import preflight_child\n"
                    "preflight_child(sys.argv[1], sys.argv[2])\n")


def preflight_child(request: str, answer: str) -> None:
    """The child's side of :func:`preflight_apart`: run :func:`preflight` on the pickled
    ``(values, results_dir, initial_out, scope, hyper, search)`` and write ``{"error":
    message or None, "warnings": [...]}``."""
    from flower_pfl.reliability.preflight import preflight

    with open(request, "rb") as fh:
        values, results_dir, initial_out, scope, hyper, search = pickle.load(fh)
    error = None
    with warnings.catch_warnings(record=True) as caught:
        record_every_warning()  # not libraries' deprecations
        try:
            preflight(values, results_dir, initial_out, scope, hyper, search)
        except Exception as exc:  # noqa: BLE001 - PreflightError, DataError, ...: its message
            error = str(exc)
    seen = [{"category": w.category.__name__, "message": str(w.message),
             "filename": w.filename, "lineno": w.lineno} for w in caught]
    atomic_write_text(answer, json.dumps({"error": error, "warnings": seen}))


def preflight_apart(cfg: Any, results_dir: str | Path | None = None,
                    timeout_s: float | None = 900,
                    initial_out: str | Path | None = None, scope: str | None = None) -> None:
    """:func:`preflight` in a child process (same interpreter, same ``sys.path``), so this
    process never imports torch: the child's error is raised here as a PreflightError with
    the same message, its warnings are warned again here.  ``scope`` (:data:`SCOPES`;
    ``run`` passes ``cluster`` with ``--ray-address``): by default ``cluster`` where this
    process joins an existing Ray cluster (``RAY_ADDRESS``), else ``simulation``."""
    from flower_pfl.reliability.preflight import PreflightError

    if scope is None:
        from flower_pfl.raynode import joined_cluster

        scope = "cluster" if joined_cluster() else "simulation"
    values = dict(cfg if isinstance(cfg, dict) else cfg.values)
    hyper = getattr(cfg, "hyper", None)
    source = getattr(cfg, "source", None)  # the factory's module: beside the config file
    search = ([str(Path(source).resolve().parent)] if isinstance(source, str)
              and Path(source).is_file() else []) + [str(Path.cwd())]
    with tempfile.TemporaryDirectory(prefix="flower-pfl-preflight-") as tmp:
        request, answer = Path(tmp) / "request.pkl", Path(tmp) / "answer.json"
        request.write_bytes(pickle.dumps((values, None if results_dir is None
                                          else str(results_dir),
                                          None if initial_out is None else str(initial_out),
                                          scope, None if hyper is None else dict(hyper),
                                          search)))
        try:
            done = run_python(_PREFLIGHT_CHILD, str(request), str(answer), timeout_s=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise PreflightError(f"the preflight check did not finish in {timeout_s:.0f} s"
                                 ) from exc
        if not answer.is_file():
            raise PreflightError(f"the preflight check failed (exit {done.returncode}):\n"
                                 f"{done.stderr[-3000:]}")
        result = json.loads(answer.read_text())
    for w in result["warnings"]:
        category = getattr(builtins, w["category"], None)
        if not (isinstance(category, type) and issubclass(category, Warning)):
            category = UserWarning
        warnings.warn_explicit(w["message"], category, w["filename"], w["lineno"])
    if result["error"] is not None:
        raise PreflightError(result["error"])
