"""The run checked before anything starts: the output folder, the data and the model.

:func:`preflight` checks that the output folder is writable, the dataset files load, the
partition leaves every client a train and a test split, and the model takes the data's
samples and has an output per class; each failure is a :class:`PreflightError` whose
message names the cause and the setting that fixes it.

The launcher runs it in a short-lived child process (:func:`preflight_apart`): checking
the model imports torch, which costs a process ~280 MB of private memory even on a CPU
run, and the launcher lives as long as the run.  The child's error comes back with the
same message; its Python warnings are raised again in the launcher.
"""

from __future__ import annotations

import builtins
import json
import pickle
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping, Protocol, Union

from flower_pfl.atomic import atomic_write_text
from flower_pfl.child import run_python


class PreflightError(RuntimeError):
    """The run cannot start: the message names the cause (data, model, output folder)."""


def check_output_dir(results_dir: str | Path) -> None:
    path = Path(results_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise PreflightError(f"the output directory {path} is not writable "
                             f"({exc.strerror or exc}); set 'output-dir' (or 'run-name') to a "
                             f"folder you can write") from exc



class HasValues(Protocol):
    """A run configuration (config.RunConfig, which this layer does not import)."""

    @property
    def values(self) -> Mapping[str, Any]: ...


Configured = Union[HasValues, dict[str, Any]]  # a RunConfig or its values

def preflight(cfg: Configured, results_dir: str | Path | None = None,
              initial_out: str | Path | None = None) -> None:
    """Everything that can be checked before training starts, each with a clear message:
    the output folder, the dataset files, every client's train and test split, and the
    model against the data's shape and labels.  With ``initial_out``, once every check has
    passed, the run's initial model is written there for the ServerApp
    (:func:`flower_pfl.initial_model.write`; not for the synthetic task, whose model has
    nothing to check)."""
    if results_dir is not None:
        check_output_dir(results_dir)
    values = cfg if isinstance(cfg, dict) else cfg.values
    from flower_pfl.learning import data as data_mod
    from flower_pfl.learning.partitions import get_partition

    if values["data.dataset"] == "synthetic-gaussian":
        return
    try:
        x, y = data_mod.load_pooled(values["data.dataset"], values["data.root"],
                                    values.get("cache-dir"))
        part = get_partition(values, y)
    except data_mod.DataError as exc:
        raise PreflightError(str(exc)) from exc
    for pid, (tr, te) in enumerate(zip(part.train, part.test)):
        if len(tr) == 0 or len(te) == 0:
            raise PreflightError(f"the partition leaves client {pid} with {len(tr)} training and "
                                 f"{len(te)} test sample(s); lower 'clients', raise "
                                 f"'data.subsample' or change 'data.test-fraction'")
    import torch

    from flower_pfl.learning.models import model_for

    model = model_for(values)
    sample = data_mod.to_tensor(x[part.train[0][:1]], values["data.dataset"])
    try:
        with torch.no_grad():
            out = model(sample)
    except Exception as exc:  # noqa: BLE001 - any failure means the shapes do not match
        raise PreflightError(f"model '{values['model']}' does not fit dataset "
                             f"'{values['data.dataset']}': samples of shape "
                             f"{tuple(sample.shape[1:])} fail in the model ({exc})") from exc
    labels = int(y.max()) + 1
    if out.ndim != 2 or out.shape[1] < labels:
        raise PreflightError(f"model '{values['model']}' gives {tuple(out.shape[1:])} outputs "
                             f"per sample but dataset '{values['data.dataset']}' has {labels} "
                             f"classes")
    if initial_out is not None:
        from flower_pfl import initial_model

        initial_model.write(initial_out, values)


#: the child of :func:`preflight_apart`: request (pickle) in, answer (JSON) out
_PREFLIGHT_CHILD = ("import sys\n"
                    "from flower_pfl.reliability.preflight import preflight_child\n"
                    "preflight_child(sys.argv[1], sys.argv[2])\n")


def preflight_child(request: str, answer: str) -> None:
    """The child's side of :func:`preflight_apart`: run :func:`preflight` on the pickled
    ``(values, results_dir, initial_out)`` and write ``{"error": message or None,
    "warnings": [...]}``."""
    with open(request, "rb") as fh:
        values, results_dir, initial_out = pickle.load(fh)
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            preflight(values, results_dir, initial_out)
        except Exception as exc:  # noqa: BLE001 - PreflightError, DataError, ...: its message
            error = str(exc)
    seen = [{"category": w.category.__name__, "message": str(w.message),
             "filename": w.filename, "lineno": w.lineno} for w in caught]
    atomic_write_text(answer, json.dumps({"error": error, "warnings": seen}))


def preflight_apart(cfg: Configured, results_dir: str | Path | None = None,
                    timeout_s: float | None = 900,
                    initial_out: str | Path | None = None) -> None:
    """:func:`preflight` in a child process (same interpreter, same ``sys.path``), so this
    process never imports torch: the child's error is raised here as a PreflightError with
    the same message, its warnings are warned again here."""
    values = dict(cfg if isinstance(cfg, dict) else cfg.values)
    with tempfile.TemporaryDirectory(prefix="flower-pfl-preflight-") as tmp:
        request, answer = Path(tmp) / "request.pkl", Path(tmp) / "answer.json"
        request.write_bytes(pickle.dumps((values, None if results_dir is None
                                          else str(results_dir),
                                          None if initial_out is None else str(initial_out))))
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
