"""Reliability building blocks: checking uploads, atomic checkpoints, results-file rewind.

Pure Python + numpy; no Flower import (the strategies' base class and the launcher use it).

Upload check (:func:`check_update`).  An upload is rejected -- before it can reach any
stored model, Gram matrix, variance estimate or average -- when

* the number of arrays differs from the model's (``ParamSpec``), or any shape differs;
* an array's dtype differs from the model's (a float64 or int upload of a float32 model);
* any value is NaN or +-Inf (also any numeric metric: a NaN loss poisons averages);
* ``num_examples <= 0`` (it would weight an average by zero or flip its sign);
* ``max_norm`` is set and ``||upload - sent||_2 > max_norm``, where ``sent`` is what the
  server sent that client this round (its starting point; the initial model when the
  strategy sent nothing).  The paper setting leaves this open; we bound the *update*,
  not the model, so the bound does not depend on the model's size or distance from 0.

An upload is the model part followed by named extra parts (:class:`UploadTemplate`, declared
by the strategy: Self-FL's d_m, SCAFFOLD's dc_i); every extra array gets the same count,
shape, dtype and NaN/Inf checks as a model array, and an extra part that is itself an
update (``bounded``: an offset from the round's model, such as d_m) the same norm bound.

Checkpoints (:func:`write_checkpoint`, :func:`latest_checkpoint`).  One folder per
checkpointed round ``<results>/checkpoint/round-000R/`` holding ``state.pkl`` (server
state) and, in simulation, ``client-state/`` (the clients' personal state, hard-linked:
the clients write every file by temp file + rename, so a link keeps the old content at
no copy cost).  The folder is built under a temporary name and renamed into place, so
a crash leaves either the old or the new checkpoint, never half of one.

Preflight (:func:`preflight`): the output folder, the data and the model checked before
anything starts.  The launcher runs it in a short-lived child process
(:func:`preflight_apart`): checking the model imports torch, which costs a process ~280 MB
of private memory for this CUDA build even on a CPU run, and the launcher lives as long as
the run; the child's PreflightError comes back with the same message and its Python
warnings are raised again in the launcher.

Results rewind (:func:`rewind_csv`): on resume every ``*.csv`` with a ``round`` column
drops the rows of rounds after the checkpoint, so no round is duplicated.
"""

from __future__ import annotations

import builtins
import csv
import json
import math
import os
import pickle
import shutil
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from flower_pfl.atomic import atomic_write, atomic_write_text
from flower_pfl.child import run_python

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.pkl"
CLIENT_STATE = "client-state"


# ------------------------------------------------------------------------ uploads
@dataclass(frozen=True)
class UploadTemplate:
    """What one client's upload must look like: the ``model`` part (arrays shaped like the
    model, or the part of it the clients upload), then each ``extra`` part in order (arrays
    a strategy needs besides the model).  Extra parts named in ``bounded`` are updates in
    the model's units (offsets from the round's model): ``max-update-norm`` bounds each."""

    model: Sequence[np.ndarray]
    extra: Mapping[str, Sequence[np.ndarray]] = field(default_factory=dict)
    bounded: frozenset[str] = frozenset()

    @property
    def arrays(self) -> list[np.ndarray]:
        return [*self.model, *(a for part in self.extra.values() for a in part)]

    @property
    def parts(self) -> list[tuple[str, int]]:
        """(name, number of arrays) of each extra part, in upload order."""
        return [(name, len(part)) for name, part in self.extra.items()]

    def split(self, arrays: Sequence[Any]) -> tuple[list[Any], dict[str, list[Any]]]:
        """(model part, {name: extra part}) of an upload laid out like this template."""
        return split_parts(arrays, self.parts)

    def check(self, arrays: Sequence[np.ndarray], num_examples: int,
              metrics: Mapping[str, Any] | None = None, sent: np.ndarray | None = None,
              max_norm: float | None = None) -> str | None:
        """:func:`check_update` against this template."""
        template = self.arrays
        return check_update(arrays, num_examples, [np.shape(a) for a in template],
                            [np.asarray(a).dtype for a in template], metrics, sent, max_norm,
                            model_count=len(self.model), parts=self.parts,
                            bounded=self.bounded)


#: the config key naming the extra parts that follow the model in a download ("name:count,...")
EXTRA_ARRAYS = "extra-arrays"


def describe_parts(extra: Mapping[str, Sequence[Any]]) -> str:
    """The ``EXTRA_ARRAYS`` value of a download whose model is followed by ``extra``."""
    return ",".join(f"{name}:{len(part)}" for name, part in extra.items())


def parse_parts(text: str) -> list[tuple[str, int]]:
    return [(name, int(count)) for name, count in
            (item.rsplit(":", 1) for item in str(text or "").split(",") if item)]


def split_parts(arrays: Sequence[Any], parts: Sequence[tuple[str, int]]
                ) -> tuple[list[Any], dict[str, list[Any]]]:
    """(model, {name: extra part}) of arrays laid out as the model then ``parts``."""
    start = len(arrays) - sum(count for _, count in parts)
    if start < 0:
        raise ValueError(f"{len(arrays)} arrays cannot hold the extra parts {list(parts)}")
    model, extra = list(arrays[:start]), {}
    for name, count in parts:
        extra[name] = list(arrays[start:start + count])
        start += count
    return model, extra


def check_update(arrays: Sequence[np.ndarray], num_examples: int,
                 shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype],
                 metrics: Mapping[str, Any] | None = None, sent: np.ndarray | None = None,
                 max_norm: float | None = None, model_count: int | None = None,
                 parts: Sequence[tuple[str, int]] = (),
                 bounded: frozenset[str] | set[str] = frozenset()) -> str | None:
    """Why this upload must be rejected, or None when it is acceptable.

    ``shapes``/``dtypes`` cover the whole upload: the first ``model_count`` arrays (all by
    default) are the model part, normed against ``sent``; then the extra ``parts`` (name,
    count), each in ``bounded`` normed against zero."""
    n_model = len(shapes) if model_count is None else model_count
    labels = [f"array {i}" for i in range(n_model)]
    for name, count in parts:
        labels += [f"array {n_model + j} (extra '{name}')" for j in range(count)]
    if len(arrays) != len(shapes):
        what = f"the model has {n_model}" + "".join(f" + '{p}' {c}" for p, c in parts)
        return f"wrong number of arrays: {len(arrays)} ({what})"
    for label, a, shape, dtype in zip(labels, arrays, shapes, dtypes):
        a = np.asarray(a)
        if tuple(a.shape) != tuple(shape):
            return f"{label} has shape {tuple(a.shape)}, expected {tuple(shape)}"
        if a.dtype != dtype:
            return f"{label} has dtype {a.dtype}, expected {np.dtype(dtype)}"
    try:
        n = int(num_examples)
    except (TypeError, ValueError):
        return f"num_examples = {num_examples!r} is not an integer"
    if n <= 0:
        return f"num_examples = {n} (must be > 0)"
    for label, a in zip(labels, arrays):
        if not np.isfinite(a).all():
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            return f"{label} holds {bad} NaN/Inf value(s)"
    for key, value in (metrics or {}).items():
        if isinstance(value, float) and not math.isfinite(value):
            return f"metric '{key}' = {value}"
    if max_norm is not None:
        model = flat(arrays[:n_model])
        ref = np.zeros_like(model) if sent is None else np.asarray(sent, dtype=np.float64)
        norm = float(np.linalg.norm(model - ref))
        if norm > max_norm:
            return f"update norm {norm:.4g} exceeds max-update-norm = {max_norm:g}"
        start = n_model
        for name, count in parts:
            if name in bounded:
                norm = float(np.linalg.norm(flat(arrays[start:start + count])))
                if norm > max_norm:
                    return (f"extra '{name}' norm {norm:.4g} exceeds max-update-norm = "
                            f"{max_norm:g}")
            start += count
    return None


def flat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) \
        if len(arrays) else np.zeros(0)


# --------------------------------------------------------------------- checkpoints
def checkpoint_root(results_dir: str | Path) -> Path:
    return Path(results_dir) / CHECKPOINT_DIR


def round_dir(results_dir: str | Path, server_round: int) -> Path:
    return checkpoint_root(results_dir) / f"round-{server_round:06d}"


def latest_checkpoint(results_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = checkpoint_root(results_dir)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("round-*") if (p / STATE_FILE).is_file()
                  and not p.name.endswith(".tmp"))
    return done[-1] if done else None


def link_tree(src: Path, dst: Path) -> None:
    """Copy a folder as hard links (a real copy where linking is not possible)."""
    for dirpath, _, files in os.walk(src):
        target = dst / Path(dirpath).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if ".tmp" in name:
                continue  # a half-written temp file of a client that is still writing
            try:
                os.link(Path(dirpath) / name, target / name)
            except OSError:
                shutil.copy2(Path(dirpath) / name, target / name)


def write_checkpoint(results_dir: str | Path, server_round: int, state: Mapping[str, Any],
                     client_state_dir: Path | None = None, keep: int = 1) -> Path:
    """Atomically write ``state`` (+ a hard-link snapshot of ``client_state_dir``)."""
    final = round_dir(results_dir, server_round)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    atomic_write(tmp / STATE_FILE, lambda fh: pickle.dump(
        dict(state), fh, protocol=pickle.HIGHEST_PROTOCOL), mode="wb", fsync=True)
    if client_state_dir is not None and client_state_dir.is_dir():
        link_tree(client_state_dir, tmp / CLIENT_STATE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)  # the checkpoint appears whole or not at all
    older = sorted(p for p in checkpoint_root(results_dir).glob("round-*")
                   if p != final and not p.name.endswith(".tmp"))
    for old in older[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_checkpoint(folder: Path) -> dict[str, Any]:
    with open(folder / STATE_FILE, "rb") as fh:
        return pickle.load(fh)


def restore_client_state(folder: Path, client_state_dir: Path) -> None:
    """Replace the live client-state folder by the checkpoint's snapshot (as links)."""
    shutil.rmtree(client_state_dir, ignore_errors=True)
    client_state_dir.mkdir(parents=True, exist_ok=True)
    if (folder / CLIENT_STATE).is_dir():
        link_tree(folder / CLIENT_STATE, client_state_dir)


#: configuration keys a resumed run may set differently from the run it continues: none of
#: them changes a round already run -- how many rounds there are (``rounds``: extend a run,
#: or end a stopped one earlier), where results and caches go, what tracks them, and the
#: time limits and checkpoint interval of the rounds still to come.  Any other key (data,
#: model, strategy, hyper-parameters, seed, sampling, training) would make the continued
#: run a different experiment than its first rounds.
RESUME_FREE_KEYS = ("rounds", "output-dir", "run-name", "cache-dir", "tracking",
                    "tracking-dir", "checkpoint-every", "stall-timeout", "round-timeout")


def config_differences(saved_values: Mapping[str, Any], saved_hyper: Mapping[str, Any],
                       values: Mapping[str, Any], hyper: Mapping[str, Any],
                       free: Sequence[str] = RESUME_FREE_KEYS) -> list[str]:
    """The keys in which a resumed run's configuration (``values``, ``hyper``) differs from
    the one its checkpoint was written with, leaving out ``free`` keys; each differing
    hyper-parameter is named ``hyper.<name>``."""
    diff = sorted(k for k in set(saved_values) | set(values)
                  if k not in free and saved_values.get(k) != values.get(k))
    diff += sorted(f"hyper.{k}" for k in set(saved_hyper) | set(hyper)
                   if saved_hyper.get(k) != hyper.get(k))
    return diff


#: the file ``flower-pfl run`` writes into the results folder on SIGINT/SIGTERM/SIGHUP; the
#: ServerApp looks for it after every round and, when it is there, checkpoints that round
#: and ends the run with status ``stopped`` (docs/reliability.md)
STOP_FILE = "stop-requested"


def request_stop(results_dir: str | Path) -> Path:
    """Ask the run writing ``results_dir`` to stop after the round it is in."""
    path = Path(results_dir) / STOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)  # a signal before the run made it
    path.write_text(f"{time.time():.3f}\n")
    return path


def stop_requested(results_dir: str | Path) -> bool:
    return (Path(results_dir) / STOP_FILE).exists()


def clear_stop(results_dir: str | Path) -> None:
    (Path(results_dir) / STOP_FILE).unlink(missing_ok=True)


def mark_stopped(results_dir: str | Path) -> None:
    """Set ``status: stopped`` in the ``summary.json`` of a run the launcher stopped at
    once (a second signal: the ServerApp had no chance to write it)."""
    path = Path(results_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if summary.get("status") == "running":
        summary["status"] = "stopped"
        atomic_write_text(path, json.dumps(summary, indent=2, sort_keys=True))


def rewind_csv(path: Path, last_round: int) -> int:
    """Drop rows with ``round > last_round``; returns how many rows were dropped."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        rows = list(reader)
    if "round" not in header:
        return 0
    keep = [r for r in rows if r["round"] == "" or int(float(r["round"])) <= last_round]
    if len(keep) == len(rows):
        return 0
    def write(fh) -> None:
        w = csv.DictWriter(fh, fieldnames=header, restval="")
        w.writeheader()
        w.writerows(keep)
    atomic_write(path, write)
    return len(rows) - len(keep)


def picklable(value: Any) -> bool:
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return True
    except Exception:  # noqa: BLE001 - any failure means "cannot checkpoint this"
        return False


# ---------------------------------------------------------------------- preflight
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


def preflight(cfg, results_dir: str | Path | None = None) -> None:
    """Everything that can be checked before training starts, each with a clear message:
    the output folder, the dataset files, every client's train and test split, and the
    model against the data's shape and labels."""
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


#: the child of :func:`preflight_apart`: request (pickle) in, answer (JSON) out
_PREFLIGHT_CHILD = ("import sys\n"
                    "from flower_pfl.reliability import preflight_child\n"
                    "preflight_child(sys.argv[1], sys.argv[2])\n")


def preflight_child(request: str, answer: str) -> None:
    """The child's side of :func:`preflight_apart`: run :func:`preflight` on the pickled
    ``(values, results_dir)`` and write ``{"error": message or None, "warnings": [...]}``."""
    with open(request, "rb") as fh:
        values, results_dir = pickle.load(fh)
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            preflight(values, results_dir)
        except Exception as exc:  # noqa: BLE001 - PreflightError, DataError, ...: its message
            error = str(exc)
    seen = [{"category": w.category.__name__, "message": str(w.message),
             "filename": w.filename, "lineno": w.lineno} for w in caught]
    atomic_write_text(answer, json.dumps({"error": error, "warnings": seen}))


def preflight_apart(cfg, results_dir: str | Path | None = None,
                    timeout_s: float | None = 900) -> None:
    """:func:`preflight` in a child process (same interpreter, same ``sys.path``), so this
    process never imports torch: the child's error is raised here as a PreflightError with
    the same message, its warnings are warned again here."""
    values = dict(cfg if isinstance(cfg, dict) else cfg.values)
    with tempfile.TemporaryDirectory(prefix="flower-pfl-preflight-") as tmp:
        request, answer = Path(tmp) / "request.pkl", Path(tmp) / "answer.json"
        request.write_bytes(pickle.dumps((values, None if results_dir is None
                                          else str(results_dir))))
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
