"""A run asked to stop after the round it is in.

``flower-pfl run`` writes :data:`STOP_FILE` into the results folder on SIGINT/SIGTERM/
SIGHUP (:func:`request_stop`); the ServerApp looks for it after every round and, when it
is there, checkpoints that round and ends the run with status ``stopped``.  A second
signal stops the run at once; the launcher then marks ``summary.json`` itself
(:func:`mark_stopped`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flower_pfl.atomic import atomic_write_text

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
