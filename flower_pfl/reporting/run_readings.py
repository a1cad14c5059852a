"""Readings derived from one run's tables (its ``clients.csv`` and ``fit.csv``, read
through :func:`flower_pfl.reporting.run_files.read_rows`): the last evaluated round, the
loss per round, the clients that never trained.  The run's curves, compare and the bench
tables use them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from flower_pfl.reporting.run_files import read_rows


def untrained(clients: Sequence[Mapping[str, Any]]) -> list[int]:
    """Partition-ids whose evaluation row says they never trained (``fit-rounds`` 0)."""
    return sorted(int(c["partition-id"]) for c in clients
                  if "fit-rounds" in c and str(c["fit-rounds"]) != ""
                  and int(float(c["fit-rounds"])) == 0)


def last_evaluation(run_dir: Path) -> tuple[int | None, list[dict[str, str]]]:
    """(round, clients.csv rows) of a run's last evaluated round; (None, []) without one."""
    rows = read_rows(run_dir, "clients")
    if not rows:
        return None, []
    last = max(int(r["round"]) for r in rows)
    return last, [r for r in rows if int(r["round"]) == last]


def loss_by_round(run_dir: Path) -> dict[str, dict[int, float]]:
    """Per round: the mean ``train_loss`` of the accepted uploads (fit.csv) and the clients'
    personalized test loss weighted by their test samples (clients.csv)."""
    out: dict[str, dict[int, float]] = {"train": {}, "personalized test": {}}
    fits: dict[int, list[float]] = {}
    for r in read_rows(run_dir, "fit"):
        try:
            fits.setdefault(int(r["round"]), []).append(float(r["train_loss"]))
        except (KeyError, ValueError):
            continue
    out["train"] = {k: float(np.mean(v)) for k, v in fits.items()}
    tests: dict[int, tuple[list[float], list[float]]] = {}
    for r in read_rows(run_dir, "clients"):
        try:
            loss, w = float(r["loss"]), float(r.get("num-test") or 1)
        except (KeyError, ValueError):
            continue
        ls, ws = tests.setdefault(int(r["round"]), ([], []))
        ls.append(loss)
        ws.append(w)
    out["personalized test"] = {k: float(np.average(ls, weights=ws))
                                for k, (ls, ws) in tests.items() if sum(ws) > 0}
    return {k: v for k, v in out.items() if v}
